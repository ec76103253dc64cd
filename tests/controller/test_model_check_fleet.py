"""`llmgw model check MODEL` on a real fleet of sim engines: a sim that passes every probe and one that fails
the tools probe on purpose. The controller checks each new model and engine version by itself; the
verdicts reach the router, whose /v1/models lists what was verified and what failed, and a tools request
never goes to a replica whose engine failed the tools probe; an unchecked one serves it unless its model
is `verified_only` (docs/router.md, Capabilities)."""

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


def _model(name: str, args: str = "", fallbacks: str = "", spec: str = "") -> str:
    extra = f", {args}" if args else ""
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  capabilities: [chat, tools]{spec}
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


async def _checks(cluster: Cluster) -> list[dict[str, Any]]:
    assert cluster.admin is not None
    checks: list[dict[str, Any]] = (await cluster.admin.get("/api/v1/model-checks"))["checks"]
    return checks


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

    # The controller checked each new model and engine version by itself, once.
    async def auto_checked() -> list[dict[str, Any]] | None:
        checks = await _checks(cluster)
        return checks if len(checks) == 3 else None

    automatic = await wait_for(auto_checked, 60, "the automatic model checks of good, bad and worse")
    assert {(c["model"], c["passed"]) for c in automatic} == {
        ("good", True),
        ("bad", False),
        ("worse", False),
    }

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

    checks = await _checks(cluster)
    assert {(c["model"], c["passed"]) for c in checks} == {("good", True), ("bad", False), ("worse", False)}
    said = [e["message"] for e in await cluster.events() if e["kind"] == "model_checked"]
    assert len(said) == 6  # three automatic, three asked for: none repeated by itself
    assert sum("(automatic: a new model, engine version or capability)" in m for m in said) == 3, said
    # Kept in the store: a restarted controller still knows them (and does not check again by itself).
    await cluster.stop_controller()
    await cluster.start_controller()
    again = await _checks(cluster)
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
        assert good["capabilities"] == ["chat", "completions", "tools"] and good["failed_capabilities"] == []
        bad = await _listed(client, "bad")
        assert bad["verified_capabilities"] == ["response_format", "stream_usage"]
        assert bad["capabilities"] == ["chat", "completions", "tools"] and bad["failed_capabilities"] == [
            "tools"
        ]
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
        # worse's only replica failed and it has no fallback: refused, saying why and what to do.
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="worse", messages=[{"role": "user", "content": "find x"}], tools=TOOLS, max_tokens=8
            )
        assert refused.value.code == "capability_check_failed"
        assert (
            "No replica of `worse` serves `tools`: the model check of its engine failed it: the engine answers "
            "in text, not tool_calls — the sim was started with fail_probes: tools. Fix that, then "
            "`llmgw model check worse` records the new verdict" in refused.value.message
        )
        await client.close()
    finally:
        router.stop()


async def test_an_unchecked_replica_serves_tools_unless_its_model_is_verified_only(tmp_path: Path) -> None:
    """With the automatic check off, sims that would pass are unknown. `open` serves a tools request at once
    (unknown is not known to fail); `strict` opted into `verified_only`, so it refuses it (never checked,
    and the message says to run the check) until `llmgw model check` verified it."""
    cluster = Cluster(tmp_path, model_checks_auto=False)
    router = None
    try:
        models = {
            "models/open.yaml": _model("open"),
            "models/strict.yaml": _model("strict", spec="\n  verified_only: true"),
        }
        await bring_up(cluster, ["n1"], models)
        await cluster.wait_ready("open", 1)
        await cluster.wait_ready("strict", 1)
        router = router_for(tmp_path, cluster)
        client = openai_client(router)
        await routed(client, "open")
        await routed(client, "strict")
        ask: Any = [{"role": "user", "content": "find x"}]
        served = await client.chat.completions.create(model="open", messages=ask, tools=TOOLS, max_tokens=8)
        assert served.choices[0].message.tool_calls
        listed = await _listed(client, "strict")
        assert (
            listed["capabilities"] == ["chat", "completions", "tools"]
            and listed["verified_capabilities"] == []
        )
        assert listed["verified_only"] is True
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="strict", messages=ask, tools=TOOLS, max_tokens=8)
        assert refused.value.code == "capability_unverified"
        assert (
            "no replica of `strict` was checked for it. Run `llmgw model check strict`"
            in refused.value.message
        )
        assert await _checks(cluster) == []  # nothing checked it by itself

        code, out = await asyncio.to_thread(cli, cluster, "model", "check", "strict")
        assert code == 0, out

        async def tools_routed() -> bool:
            try:
                answer = await client.chat.completions.create(
                    model="strict", messages=ask, tools=TOOLS, max_tokens=8
                )
            except openai.BadRequestError:
                return False  # the router has not had the snapshot with the verdict yet
            return bool(answer.choices[0].message.tool_calls)

        await wait_for(tools_routed, 30, "the tools request to be routed once verified")
        assert "tools" in (await _listed(client, "strict"))["verified_capabilities"]
        await client.close()
    finally:
        if router is not None:
            router.stop()
        await cluster.close()
        cluster.agents.cleanup()


async def test_a_new_engine_version_is_checked_again_by_itself(cluster: Cluster) -> None:
    versioned = _model("ver").replace("engine: sim,", "engine: sim, engine_version: '1.0',")
    await bring_up(cluster, ["n1"], {"models/ver.yaml": versioned})

    async def checked(version: str) -> list[dict[str, Any]] | None:
        checks = [c for c in await _checks(cluster) if c["model"] == "ver"]
        return checks if version in {c["engine_version"] for c in checks} else None

    await wait_for(lambda: checked("1.0"), 90, "the automatic check of ver on sim 1.0")
    cluster.repo.write({"models/ver.yaml": versioned.replace("'1.0'", "'1.1'")}, "sim 1.1")
    found = await wait_for(lambda: checked("1.1"), 90, "the automatic check of ver on sim 1.1")
    assert {(c["engine_version"], c["passed"]) for c in found} == {("1.0", True), ("1.1", True)}
