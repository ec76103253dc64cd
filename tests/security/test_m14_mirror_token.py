"""M14: an agent's hub token goes to the controller's own mirror, never to a mirror URL a repo editor chose.

The exploit (security review M14): `mirror: {url: "http://collector.example"}` in the Cluster and any `repo`
source, and every node presented its hub token (the node token, or the shared Cluster token) to the collector.
Here a real Agent's mirror credential is used by the real directory fetcher against two listeners: a collector
on another host (127.0.0.2) and a mirror on the controller's own host (127.0.0.1, the control showing the token
is sent where it belongs).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from llmgw_agent import dirfetch
from llmgw_agent.config import AgentConfig
from llmgw_agent.daemon import Agent
from llmgw_agent.mirror_auth import hub_token_may_go
from llmgw_agent.protocol import FetchBase, WeightSource
from llmgw_agent.weights import WeightsError

HUB_TOKEN = "llmgw-nt-node-a-0123456789abcdef"


@pytest.fixture
async def listeners() -> AsyncIterator[dict[str, tuple[str, list[str | None]]]]:
    """`collector` on 127.0.0.2 and `own` on 127.0.0.1: each records the Authorization it is sent and 404s."""
    out: dict[str, tuple[str, list[str | None]]] = {}
    runners: list[web.AppRunner] = []
    for name, host in (("collector", "127.0.0.2"), ("own", "127.0.0.1")):
        heard: list[str | None] = []

        async def answer(request: web.Request, heard: list[str | None] = heard) -> web.StreamResponse:
            heard.append(request.headers.get("Authorization"))
            return web.Response(status=404)

        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        out[name] = (f"http://{host}:{port}", heard)
    yield out
    for runner in runners:
        await runner.cleanup()


def _agent(tmp_path: Path) -> Agent:
    token = tmp_path / "token"
    token.write_text(HUB_TOKEN + "\n")
    # The controller this agent dials is on 127.0.0.1 (its port is not the mirror's: `--mirror-listen`).
    cfg = AgentConfig(
        controllers=["127.0.0.1:7070"], token_file=str(token), state_dir=str(tmp_path / "state")
    )
    return Agent(cfg)


async def _fetch_from_mirror(agent: Agent, mirror: str, cache: Path) -> None:
    base = FetchBase(url=mirror + "/org/model/resolve/main/", kind="mirror")
    source = WeightSource(directory="org/model@main", bases=[base])
    with pytest.raises(WeightsError):  # both listeners answer 404: what matters is what they were sent
        await dirfetch.resolve_directory(
            source, cache, lambda d, t: None, mirror_headers=agent.supervisor.cfg.mirror_headers
        )


async def test_a_repo_chosen_mirror_gets_no_hub_token_the_controllers_own_does(
    listeners: dict[str, tuple[str, list[str | None]]], tmp_path: Path
) -> None:
    agent = _agent(tmp_path)
    collector, heard_by_collector = listeners["collector"]
    own, heard_by_own = listeners["own"]
    await _fetch_from_mirror(agent, collector, tmp_path / "c1")
    await _fetch_from_mirror(agent, own, tmp_path / "c2")
    assert heard_by_collector == [None]  # asked, but with no credential
    assert heard_by_own == [f"Bearer {HUB_TOKEN}"]


def test_the_rule_pins_the_controllers_hosts() -> None:
    controllers = ["wss://ctl-a.internal:7070/agent/v1", "wss://ctl-b.internal:7070/agent/v1"]
    assert hub_token_may_go("http://ctl-b.internal:7073/org/m/resolve/main/", controllers)
    assert hub_token_may_go("https://CTL-A.internal/x/", controllers)
    for elsewhere in (
        "http://collector.example/x/",
        "http://ctl-a.internal.collector.example/x/",
        "http://ctl-a.internal@collector.example/x/",
        "ftp://ctl-a.internal/x/",
    ):
        assert not hub_token_may_go(elsewhere, controllers), elsewhere
