"""Finding the Prometheus programs the observability tests run: skip locally, fail in CI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

INSTALL_HINT = "Debian package `prometheus`; run scripts/install-system-deps.sh"


def tools_required() -> bool:
    """CI (or LLMGW_REQUIRE_TOOLS) must never pass by skipping a test whose program is missing."""
    return any(
        os.environ.get(name, "").lower() not in ("", "0", "false", "no")
        for name in ("CI", "LLMGW_REQUIRE_TOOLS")
    )


def require_tool(name: str) -> str:
    """Path of `name` (on PATH or in /usr/bin); skip with the reason when missing, or fail when required."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        reason = f"{name} not found ({INSTALL_HINT})"
        if tools_required():
            pytest.fail(f"{reason}; CI or LLMGW_REQUIRE_TOOLS is set, so this is an error, not a skip")
        pytest.skip(reason)
    return found
