"""L8: teardown removes exactly the paths it means, and an install prefix that could mislead it is refused.

Teardown's removal runs in a real shell here (the same script bootstrap sends over SSH), against a real
directory tree whose names hold spaces.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import ValidationError

from llmgw.adapters.ssh import bootstrap, render
from llmgw.controller.parts.settings import ControllerOptions


class LocalShell:
    """The two calls teardown makes on a Remote, run by /bin/sh on this machine instead of over SSH."""

    async def run(self, command: str, *, check: bool = True) -> str:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        assert not check or proc.returncode == 0, out
        return out.decode()

    async def status(self, command: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh", "-c", command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        return proc.returncode or 0, out.decode()


@dataclass(frozen=True)
class SpacedLayout(render.Layout):
    """A layout whose removable paths hold spaces (as a path from any future source might)."""

    spaced: str = ""

    def removable(self) -> list[str]:
        return [f"{self.spaced}/venv", f"{self.spaced}/state"]

    def kept(self) -> list[str]:
        return []


async def test_l8_teardown_does_not_word_split_paths(tmp_path: Path) -> None:
    spaced = tmp_path / "my llmgw"
    for name in ("venv", "state"):
        (spaced / name).mkdir(parents=True)
    # What the old `echo "$p"` + split would have removed: `.../my` and `llmgw/venv`.
    victim = tmp_path / "my"
    victim.mkdir()
    (victim / "precious").write_text("keep me")
    layout = SpacedLayout(prefix=str(tmp_path / "opt"), spaced=str(spaced))
    steps: list[tuple[str, str, str]] = []

    def record(name: str, status: bootstrap.Status, detail: str = "") -> None:
        steps.append((name, status, detail))

    await bootstrap._remove(LocalShell(), bootstrap.TeardownOptions(layout=layout), record)  # type: ignore[arg-type]

    assert (victim / "precious").read_text() == "keep me"
    assert not (spaced / "venv").exists() and not (spaced / "state").exists()
    removed = next(detail for name, _, detail in steps if name == "remove")
    assert removed == f"removed {spaced}/venv, {spaced}/state"


@pytest.mark.parametrize(
    ("prefix", "rule"),
    [
        ("/opt/my llmgw", "must not contain whitespace"),
        ("/opt/llmgw\n/etc", "must not contain whitespace"),
        ("opt/llmgw", "must be an absolute path"),
        ("/opt/../etc", "must not contain `.` or `..`"),
        ("/opt/./llmgw", "must not contain `.` or `..`"),
        ("/", "at the root"),
        ("//", "at the root"),
    ],
)
def test_l8_node_prefix_is_validated(prefix: str, rule: str) -> None:
    assert rule in (render.prefix_problem(prefix) or "")
    with pytest.raises(ValueError, match=re.escape(rule)):
        render.Layout(prefix=prefix)
    with pytest.raises(ValidationError, match="node prefix"):
        ControllerOptions(repo="/repo", node_prefix=prefix)


def test_l8_good_prefixes_pass() -> None:
    for prefix in ("/opt/llmgw", "/srv/llm-gw_2", "/opt/llmgw/"):
        assert render.prefix_problem(prefix) is None
    assert render.Layout(prefix="/opt/llmgw/").venv == "/opt/llmgw/venv"
