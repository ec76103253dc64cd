"""A project's response_cache in the repo: loaded as written, and its mistakes refused at file:line:col with
what would be right."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.adapters.repo_files import load_repo

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: bot}
spec:
  organization: acme
  response_cache:
CACHE
"""


def load(tmp_path: Path, cache: str):  # type: ignore[no-untyped-def]
    (tmp_path / "tenants.yaml").write_text(TENANTS.replace("CACHE", cache))
    return load_repo(tmp_path)


def test_a_cache_loads_with_its_defaults(tmp_path: Path) -> None:
    result = load(tmp_path, '    ttl: 10m\n    hit_charge: 0.25\n    models: ["qwen-*"]')
    assert result.ok and result.repo is not None, [str(e) for e in result.errors]
    # As the controller publishes it to routers (the catalog's tenant tree).
    spec = result.repo.catalog.tenants().projects["bot"].response_cache
    assert spec is not None
    assert (spec.ttl, spec.hit_charge, spec.models) == ("10m", 0.25, ["qwen-*"])
    assert (spec.max_bytes, spec.max_entry_bytes) == (64 * 1024 * 1024, 1024 * 1024)


@pytest.mark.parametrize(
    ("cache", "says"),
    [
        (
            "    ttl: 10m\n    max_bytes: 70000\n    max_entry_bytes: 100000",
            "make max_entry_bytes at most max_bytes",
        ),
        ("    ttl: 500ms", "ttl 500ms is under a second; write at least 1s"),
        ("    ttl: 10m\n    hit_charge: 2", "must be at most 1.0"),
        ("    max_bytes: 70000", "ttl"),
    ],
)
def test_a_bad_cache_is_refused_at_its_place(tmp_path: Path, cache: str, says: str) -> None:
    result = load(tmp_path, cache)
    assert not result.ok
    text = [str(e).replace(str(tmp_path) + "/", "") for e in result.errors]
    assert any(t.startswith("tenants.yaml:") and "response_cache" in t and says in t for t in text), text
