"""docs/clients.md names the versions the client suite runs: each one it lists is the locked one (uv.lock for the
Python clients, tests/clients/node/package-lock.json for the npm ones), so a lock change that moves a client
cannot leave the table behind. Reads files only: runs in `make test-fast`."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from clients.gateway import NODE_DIR

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "clients.md"
PYTHON = [
    "openai-agents",
    "pydantic-ai-slim",
    "instructor",
    "langchain",
    "langchain-openai",
    "llm",
    "anthropic",
]
NPM = ["openai", "ai", "@ai-sdk/openai-compatible"]


def rows() -> dict[str, str]:
    """Each table row's first cell (the client, with its package names in backticks) -> its version cell."""
    found = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.match(r"\d", cells[1]):
            found[cells[0]] = cells[1]
    return found


def documented(package: str, table: dict[str, str], npm: bool) -> list[str]:
    """The versions the table gives `package`: its row is the one naming it in backticks (or as the client's
    name), and the row's versions are in the order of its backticked names."""
    for client, versions in table.items():
        names = re.findall(r"`([^`]+)`", client) or [client.split(" (")[0]]
        names = [n.removesuffix("[openai]") for n in names]
        if package in names and ("(npm)" in client or "Vercel" in client) == npm:
            return [versions.split(", ")[names.index(package)]]
    return []


def test_every_client_version_in_the_doc_is_the_locked_one() -> None:
    table = rows()
    locked = {p["name"]: p["version"] for p in tomllib.loads((ROOT / "uv.lock").read_text())["package"]}
    for package in PYTHON:
        assert documented(package, table, npm=False) == [locked[package]], (package, table)
    packages = json.loads((NODE_DIR / "package-lock.json").read_text())["packages"]
    for package in NPM:
        assert documented(package, table, npm=True) == [packages[f"node_modules/{package}"]["version"]], (
            package
        )
