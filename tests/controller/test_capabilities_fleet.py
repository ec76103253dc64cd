"""A change of what a model serves is checked by itself (issue 37): the controller keeps one result per probe
for each (model, engine, version), so a capability the repo starts to serve after the key was checked is
due at once, and the routers follow. A real controller, agent, sim and router."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import bring_up, openai_client, routed, router_for

pytestmark = pytest.mark.integration

TOOLS: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
ASK: Any = [{"role": "user", "content": "find x"}]
MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: m}
spec:
  context_length: 4096%s
  profiles:
    - {name: sim, engine: sim, cpu_cores: 1, args: {decode_ms_per_token: 1}}
"""


async def _probes(cluster: Cluster) -> list[str] | None:
    assert cluster.admin is not None
    checks = (await cluster.admin.get("/api/v1/model-checks"))["checks"]
    return sorted(p["probe"] for c in checks for p in c["probes"]) if checks else None


async def test_a_capability_served_later_is_checked_by_itself(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path)
    router = None
    try:
        await bring_up(cluster, ["n1"], {"models/m.yaml": MODEL % "\n  without: [tools]"})
        await cluster.wait_ready("m", 1)
        first = await wait_for(lambda: _probes(cluster), 60, "the automatic check of m")
        assert first == ["response_format", "stream_usage"]  # tools is not served: not probed
        router = router_for(tmp_path, cluster)
        client = openai_client(router)
        await routed(client, "m")
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=8)
        assert refused.value.code == "unsupported_capability"
        assert "remove `tools` from the model's `without`" in refused.value.message

        cluster.repo.write({"models/m.yaml": MODEL % ""}, "m serves tools")  # the kind's default again

        async def rechecked() -> list[str] | None:
            found = await _probes(cluster)
            return found if found and "tools" in found else None

        assert await wait_for(rechecked, 60, "the automatic check of tools") == [
            "response_format",
            "stream_usage",
            "tools",
        ]

        async def events() -> list[str] | None:
            said = [e["message"] for e in await cluster.events() if e["kind"] == "model_checked"]
            return said if len(said) == 2 else None

        said = await wait_for(events, 30, "the second model_checked event")
        [later] = [m for m in said if "tools" in m]  # the events' order is the log's, not asserted
        assert "(automatic: a new model, engine version or capability)" in later, said
        assert later.endswith(": tools: ok"), later  # only the probe never run for this key

        async def verified() -> bool:
            page = await client.models.list()
            card = next(m.model_dump() for m in page.data if m.id == "m")
            return "tools" in card["verified_capabilities"] and card["without"] == []

        await wait_for(verified, 30, "the router to learn the new verdict")
        answer = await client.chat.completions.create(model="m", messages=ASK, tools=TOOLS, max_tokens=8)
        assert answer.choices[0].message.tool_calls
        await client.close()
    finally:
        if router is not None:
            router.stop()
        await cluster.close()
        cluster.agents.cleanup()
