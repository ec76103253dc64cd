"""`llmgw model check MODEL` on a real fleet of sim engines: a sim that passes every probe and one that fails
the tools probe on purpose; the verdicts reach the router, whose /v1/models lists only what was verified,
and a tools request is never sent to a replica whose engine failed the tools probe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import openai
import pytest
from faults.cluster import Cluster
from support import wait_for

from controller.fleet_ops import bring_up, cli, openai_client, routed, router_for

pytestmark = pytest.mark.integration

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }
]


def _model(name: str, args: str = "", fallbacks: str = "") -> str:
    extra = f", {args}" if args else ""
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  capabilities: [chat, tools]
  fallbacks: [{fallbacks}]
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, args: {{decode_ms_per_token: 1{extra}}}}}
"""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        await c.close()
        c.agents.cleanup()


async def _listed(client: openai.AsyncOpenAI, model: str) -> dict[str, Any]:
    page = await client.models.list()
    return next(m.model_dump() for m in page.data if m.id == model)


async def test_verdicts_for_a_passing_and_a_failing_sim_and_the_router_follows_them(
    cluster: Cluster, tmp_path: Path
) -> None:
    models = {
        "models/good.yaml": _model("good"),
        "models/bad.yaml": _model("bad", "fail_probes: tools", fallbacks="good"),
        "models/worse.yaml": _model("worse", "fail_probes: 'tools,stream_usage'"),
    }
    await bring_up(cluster, ["n1", "n2"], models)
    for name in ("good", "bad", "worse"):
        await cluster.wait_ready(name, 1)

    code, out = await asyncio.to_thread(cli, cluster, "model", "check", "good")
    assert code == 0, out
    assert "good on sim unknown (replica good-" in out
    assert "  tools: ok: a tool call, and the tool's result answered in words" in out
    assert "  response_format: ok: JSON valid against the schema" in out
    assert "  stream_usage: ok: usage" in out
    code, out = await asyncio.to_thread(cli, cluster, "model", "check", "bad")
    assert code == 1, out
    assert (
        "  tools: the engine answers in text, not tool_calls — the sim was started with fail_probes: tools"
        in out
    )
    assert "  response_format: ok" in out
    code, out = await asyncio.to_thread(cli, cluster, "model", "check", "worse")
    assert code == 1 and "stream_usage: the stream ends without a usage chunk" in out, out

    checks = (await cluster.admin.get("/api/v1/model-checks"))["checks"]  # type: ignore[union-attr]
    assert {(c["model"], c["passed"]) for c in checks} == {("good", True), ("bad", False), ("worse", False)}
    kinds = [e["kind"] for e in await cluster.events()]
    assert kinds.count("model_checked") == 3
    # Kept in the store: a restarted controller still knows them (and the routers are told them again).
    await cluster.stop_controller()
    await cluster.start_controller()
    again = (await cluster.admin.get("/api/v1/model-checks"))["checks"]  # type: ignore[union-attr]
    assert again == checks
    for name in ("good", "bad", "worse"):
        await cluster.wait_ready(name, 1)

    router = router_for(tmp_path, cluster)
    try:
        client = openai_client(router)
        for name in ("good", "bad", "worse"):
            await routed(client, name)

        async def verified() -> dict[str, Any] | None:
            good = await _listed(client, "good")
            return good if "tools" in good["verified_capabilities"] else None

        good = await wait_for(verified, 30, "the router to learn the verdicts")
        assert good["verified_capabilities"] == ["response_format", "stream_usage", "tools"]
        assert (await _listed(client, "bad"))["verified_capabilities"] == ["response_format", "stream_usage"]
        assert (await _listed(client, "worse"))["verified_capabilities"] == ["response_format"]

        # bad's only replica failed the tools probe: its tools request goes down the fallback chain.
        raw = await client.chat.completions.with_raw_response.create(
            model="bad", messages=[{"role": "user", "content": "find x"}], tools=TOOLS, max_tokens=8
        )
        assert raw.headers["x-llmgw-model"] == "good"
        assert raw.parse().choices[0].message.tool_calls
        # A request without tools still goes to bad's replica.
        plain = await client.chat.completions.with_raw_response.create(
            model="bad", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert plain.headers["x-llmgw-model"] == "bad"
        # worse has no replica that passed and no fallback: refused, saying why.
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="worse", messages=[{"role": "user", "content": "find x"}], tools=TOOLS, max_tokens=8
            )
        assert refused.value.code == "capability_unverified"
        assert "No replica of `worse` passed the tools check" in refused.value.message
        await client.close()
    finally:
        router.stop()
