"""Helpers for the restart, drain and preemption tests on a real fleet: a controller in this process, agents
and sim engines as processes, a router following the controller, and load driven with the openai client
whose every failure is kept."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from faults.cluster import Cluster
from faults.procs import RouterProc, start_router_following
from support import wait_for
from typer.testing import CliRunner

from controller.helpers import cluster_yaml
from llmgw.cli.main import app

KEY = "sk-llmgw-" + "r" * 43


def sim_model(
    name: str, min_: int, cores: int = 1, extra: str = "", args: str = "decode_ms_per_token: 2"
) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  scaling: {{min: {min_}, max: {min_}}}{extra}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: {cores}, args: {{{args}}}}}
"""


async def bring_up(
    cluster: Cluster, nodes: list[str], models: dict[str, str], cluster_extra: str = ""
) -> None:
    """The cluster document first, agents Ready, then the models committed."""
    cluster.repo.write(
        {"cluster.yaml": cluster_yaml(unreachable="2s", lost="30s") + cluster_extra}, "cluster"
    )
    admin = await cluster.start_controller()
    for node in nodes:
        cluster.agents.start(node, cluster.address)

    async def all_ready() -> bool:
        return all([await admin.node_state(n) == "Ready" for n in nodes])

    await wait_for(all_ready, 30, f"nodes {nodes} Ready")
    cluster.repo.write(models, "models")


@dataclass
class Load:
    """Requests sent back to back by a few workers until stopped; every failure is kept with its words."""

    client: openai.AsyncOpenAI
    model: str
    workers: int = 3
    max_tokens: int = 8
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def _worker(self, n: int) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            try:
                r = await self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": f"load {n}-{i}"}],
                    max_tokens=self.max_tokens,
                )
                if r.choices and r.choices[0].message.content:
                    self.answered += 1
                else:
                    self.failures.append(f"empty answer: {r}")
            except openai.APIError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Load]:
        tasks = [asyncio.create_task(self._worker(n)) for n in range(self.workers)]
        try:
            yield self
        finally:
            self._stop.set()
            await asyncio.gather(*tasks)


def openai_client(router: RouterProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=router.api + "/v1", api_key=KEY, max_retries=0, timeout=30)


async def routed(client: openai.AsyncOpenAI, model: str) -> None:
    """Wait until the router answers for `model` (refusals before it has the endpoints are expected)."""

    async def answered() -> bool:
        try:
            r = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            return bool(r.choices)
        except openai.APIError:
            return False

    await wait_for(answered, 30, f"the router to answer for {model}")


def cli(cluster: Cluster, *args: str) -> tuple[int, str]:
    """Run `llmgw ARGS` against the cluster's controller (call it in a thread: the controller runs on the
    test's event loop); its exit code and output."""
    flags = ["--controller", f"http://{cluster.address}", "--token-file", str(cluster.tmp / "token")]
    result = CliRunner().invoke(app, [*args, *flags])
    return result.exit_code, result.output


def router_for(tmp: Path, cluster: Cluster) -> RouterProc:
    return start_router_following(tmp, [cluster.address], KEY)


async def replicas_of(cluster: Cluster, model: str) -> list[dict[str, Any]]:
    assert cluster.admin is not None
    return await cluster.admin.replicas(model)
