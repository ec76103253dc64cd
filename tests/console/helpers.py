"""An `llmgw up`-style cluster for the console's browser tests: a controller and a router in one asyncio loop
(as `llmgw up` runs them), a real agent process running sim engines, a project key in the store; and
Chromium from Debian driven by Playwright.

The loop runs in a thread of its own: Playwright's sync API drives the browser from the test's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from controller.helpers import Agents, Repo, cluster_yaml, model_yaml, settings_for

from llmgw.adapters import keys as keymod
from llmgw.cli.deploy.up import LocalRouter, start_router
from llmgw.controller.app import RunningController, start_controller

T = TypeVar("T")
VENDOR = Path(__file__).resolve().parent / "vendor"
SCREENSHOTS = Path(os.environ.get("LLMGW_CONSOLE_SCREENSHOTS", ".cache/console-screenshots")).resolve()
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {limits: {rpm: 3000}}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: research}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec: {team: research, models: ["sim-*"], limits: {rpm: 600}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: other}
spec: {team: research, models: [sim-b]}
"""


def chromium() -> str:
    found = next((p for p in CHROMIUM_PATHS if Path(p).exists()), None) or shutil.which("chromium")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed (scripts/install-system-deps.sh installs it); CI is set")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


class Loop:
    """An asyncio loop in a thread; `run` waits for a coroutine scheduled on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Cluster:
    loop: Loop
    running: RunningController
    router: LocalRouter
    agents: Agents
    repo: Repo
    key: str  # project playground's key
    key_id: str
    other_key: str  # project other's key

    @property
    def url(self) -> str:
        return self.running.url

    @property
    def admin_token(self) -> str:
        return self.running.admin_token


async def _start(tmp: Path) -> tuple[RunningController, LocalRouter, Repo, keymod.NewKey, keymod.NewKey]:
    repo = Repo(tmp / "repo", use_git=False)
    repo.write(
        {
            "cluster.yaml": cluster_yaml(unreachable="5s", lost="20s"),
            "models/a.yaml": model_yaml("sim-a", min_=1),
            "models/b.yaml": model_yaml("sim-b", min_=1),
            "tenants/acme.yaml": TENANTS,
        }
    )
    settings = settings_for(tmp, repo.path)
    running = await start_controller(settings)
    router = await start_router(
        "127.0.0.1:0", "127.0.0.1:0", running.url, running.controller.router_token(), settings.store
    )
    running.console.router_url = router.base_url
    now = running.controller.wall()
    key = await keymod.create_key(running.controller.store, "playground", now, name="console-test")
    other = await keymod.create_key(running.controller.store, "other", now, name="other-project")
    return running, router, repo, key, other


@contextlib.contextmanager
def cluster(tmp: Path) -> Iterator[Cluster]:
    loop = Loop()
    running, router, repo, key, other = loop.run(_start(tmp))
    agents = Agents(tmp, tmp / "token")
    try:
        agents.start("node-a", running.url)
        yield Cluster(loop, running, router, agents, repo, key.plaintext, key.key.id, other.plaintext)
    finally:
        agents.cleanup()
        with contextlib.suppress(Exception):
            loop.run(router.close())
        with contextlib.suppress(Exception):
            loop.run(running.stop())
        loop.close()
