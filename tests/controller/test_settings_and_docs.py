"""Settings parsed once at the edge, and docs/controller.md kept equal to what the controller exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from llmgw.cli.admin_client import DEFAULT_STATE_DIR, TOKEN_FILE_NAME
from llmgw.controller.core import admin_token_from
from llmgw.controller.parts.metrics import ControllerMetrics
from llmgw.controller.parts.settings import (
    ControllerOptions,
    SettingsError,
    load_settings_file,
    setting_duration,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "controller.md"
ROW = re.compile(r"^\| `(llmgw_controller_[a-z_]+)` \| (\w+) \|", re.MULTILINE)


def test_docs_list_exactly_the_metrics_the_controller_exports() -> None:
    suffix = {"counter": "_total", "info": "_info"}
    exported = {f.name + suffix.get(f.type, ""): f.type for f in ControllerMetrics().registry.collect()}
    documented = dict(ROW.findall(DOC.read_text()))
    assert documented == exported


def test_settings_file_and_durations(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "repo: /srv/cluster\nstore: sqlite:///x.db\npoll: 2m\ndrain: 500ms\nmetrics-listen: 0.0.0.0:9100\n"
    )
    settings = ControllerOptions(**load_settings_file(path))
    assert settings.poll_s == 120.0 and settings.drain_s == 0.5
    assert settings.metrics_hostport == ("0.0.0.0", 9100)
    assert settings.source_kind() == "directory"
    assert ControllerOptions(repo="https://git.example/c.git", store="x").source_kind() == "git"
    assert setting_duration("--poll", "30") == 30.0 and setting_duration("--poll", 2.5) == 2.5
    assert setting_duration("--poll", " 1.5 m ") == 90.0
    with pytest.raises(SettingsError, match="--poll: not a duration"):
        setting_duration("--poll", "soon")
    path.write_text("repo: /srv/cluster\nstore: x\ndrain: soon\n")
    with pytest.raises(SettingsError, match="drain: not a duration"):
        load_settings_file(path)
    with pytest.raises(ValueError, match="not host:port"):
        ControllerOptions(repo=".", store="x", listen="7070")


def test_generated_admin_token_is_where_the_cli_looks(tmp_path: Path) -> None:
    settings = ControllerOptions(repo=".", store="x", state_dir=tmp_path / DEFAULT_STATE_DIR)
    token = admin_token_from(settings)
    path = tmp_path / DEFAULT_STATE_DIR / TOKEN_FILE_NAME
    assert path.read_text().strip() == token
    assert path.stat().st_mode & 0o077 == 0
    assert admin_token_from(settings) == token  # made once, the same ever after
    assert ControllerOptions.model_fields["state_dir"].default == DEFAULT_STATE_DIR
