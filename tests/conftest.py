"""Fixtures shared by every test directory (tests/ is on sys.path: pytest's prepend import mode)."""

import pytest
from fixtures.llama import llama_server  # noqa: F401  (registers the shared llama-server)
from fixtures.postgres import pg_dsn, pg_server  # noqa: F401  (registers the PostgreSQL fixtures)
from fixtures.stores import store_dsn  # noqa: F401  (registers the both-backends DSN)
from fixtures.vllm_env import vllm_python  # noqa: F401  (registers vLLM's CPU build: make vllm)

# Marks every process the run starts; after the last test, stops and names those still running (the run fails).
pytest_plugins = ["fixtures.leftover_check"]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup`, the `xdist_group` suffix (`nodeid@group`) the controller groups by. pytest-xdist
    3.8 writes it into `item._nodeid`, which pytest 9.2 no longer reads (pytest-xdist issue 1386), and grouped
    tests were spread like the rest. Until xdist sets it itself, set pytest's own node id."""
    if not getattr(config.option, "loadgroup", False):
        return
    from _pytest.nodeid import NodeId  # pytest's private type; only while xdist cannot do this itself

    for item in items:
        names = sorted(
            {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
        )
        if names and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]
