"""Fixtures for the node tests: a real sshd, the agent wheelhouse (built once, cached across sessions)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.sshd import sshd_server  # noqa: F401  (registers the fixture)
from support import worker_cache

from llmgw.adapters.ssh import wheels


@pytest.fixture(scope="session")
def wheelhouse() -> wheels.Wheelhouse:
    # pip wheel on 2 cores costs seconds, not minutes, once pip's cache is warm; keyed by the agent's source,
    # so an unchanged agent reuses the same files across sessions (one directory per xdist worker).
    return wheels.build(worker_cache("test-wheelhouse"))


@pytest.fixture
def node_root(public_tmp_path: Path) -> Path:
    """A directory every account may search, as /opt is on a node. Bootstrapping as root runs the agent as the
    unprivileged `llmgw` account, which cannot enter pytest's private tmp_path; prefixes go here instead. Inside
    the run's shared directory, so what runs from it (over SSH, without our environment) is known as this
    run's and this test's (tests/fixtures/leftover_check.py)."""
    return public_tmp_path
