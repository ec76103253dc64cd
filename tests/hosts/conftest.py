"""The host lab's fixtures: a sweep of labs left by a dead run before the first test, and a lab per test that is
torn down after it (every host powered off, every namespace deleted) even when the test fails; or one per module,
torn down after its last test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import worker_name

from hosts.lab import HostLab, drop_pg_template
from hosts.net import sweep_stale


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
        pytest.fail(f"the host lab is needed in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session", autouse=True)
def _stale_labs_swept() -> Iterator[None]:
    """Namespaces of an earlier run whose pytest process is gone (killed before its finalizer) are deleted;
    at the end, this process's PostgreSQL data template."""
    if os.geteuid() == 0 and shutil.which("ip"):
        sweep_stale()
    yield
    drop_pg_template()


def _opened(tmp: Path) -> Iterator[HostLab]:
    if os.geteuid() != 0:
        _unavailable("the host lab makes network namespaces: run tests/hosts as root")
    for tool in ("ip", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            _unavailable(f"{tool} not installed (scripts/install-system-deps.sh installs it)")
    made = HostLab(tmp, worker_name())
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[HostLab]:
    yield from _opened(tmp_path)


@pytest.fixture(scope="module")
def module_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostLab]:
    """One lab for a module's tests, built on as they go (a module whose hosts take long to install)."""
    yield from _opened(tmp_path_factory.mktemp("lab"))
