"""A small cluster for the fault tests, built from the controller tests' helpers (repo, agents, admin API):
a controller in this process, agents and engines as real processes, and checks that say what was kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controller.helpers import Admin, Agents, Repo, cluster_yaml, settings_for, start
from support import free_port, wait_for

from llmgw.controller.app import RunningController

__all__ = ["Cluster"]


class Cluster:
    """One controller (restartable on the same port and store), agents, a git cluster repo."""

    def __init__(self, tmp: Path, dsn: str | None = None, **settings: Any) -> None:
        self.tmp = tmp
        self.repo = Repo(tmp / "origin", use_git=True)
        self.port = free_port()
        self.settings = settings_for(
            tmp,
            self.repo.path,
            listen=f"127.0.0.1:{self.port}",
            store=dsn or f"sqlite:///{tmp / 'controller.db'}",
            **settings,
        )
        self.agents = Agents(tmp, tmp / "token")
        self.running: RunningController | None = None
        self.admin: Admin | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start_controller(self) -> Admin:
        self.running, self.admin = await start(self.settings)
        return self.admin

    async def stop_controller(self) -> None:
        if self.running is not None:
            await self.running.stop()
            self.running = None

    async def bring_up(self, nodes: list[str], models: dict[str, str], lost: str = "30s") -> Admin:
        """Controller on a repo with the cluster only, agents Ready, then the models committed."""
        self.repo.write({"cluster.yaml": cluster_yaml(unreachable="2s", lost=lost)}, "cluster")
        admin = await self.start_controller()
        for node in nodes:
            self.agents.start(node, self.address)

        async def all_ready() -> bool:
            return all([await admin.node_state(n) == "Ready" for n in nodes])

        await wait_for(all_ready, 30, f"nodes {nodes} Ready")
        self.repo.write(models, "models")
        return admin

    async def wait_ready(self, model: str, count: int, what: str = "") -> list[dict[str, Any]]:
        admin = self.admin
        assert admin is not None

        async def ready() -> list[dict[str, Any]] | None:
            items = await admin.replicas(model)
            good = [r for r in items if r["state"] == "ready"]
            return good if len(good) == count and len(items) == count else None

        found: list[dict[str, Any]] = await wait_for(ready, 90, what or f"{count} ready replicas of {model}")
        return found

    async def events(self, since: float = 0.0) -> list[dict[str, Any]]:
        assert self.admin is not None
        items: list[dict[str, Any]] = (await self.admin.get("/api/v1/events?limit=1000"))["events"]
        return [e for e in items if e["time"] >= since]

    async def close(self) -> None:
        await self.stop_controller()
        self.agents.cleanup()
