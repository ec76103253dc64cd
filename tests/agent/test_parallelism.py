"""A profile's tp and pp reach the engine as its own flags (../shared/engines.md): vLLM `-tp`/`-pp`, SGLang
`--tp-size`/`--pp-size`, TensorRT-LLM `--tp_size`/`--pp_size`; llama.cpp refuses both. The command lines the
agent builds, and the strict vLLM stand-in (tests/agent/standins/vllm) started with them by the supervisor."""

from __future__ import annotations

from pathlib import Path

import pytest
from llmgw_agent.engines import SpecError, launch_plan
from llmgw_agent.protocol import ShardStatus, WeightSource
from llmgw_agent.supervisor import Supervisor
from support import wait_for

from .helpers import read_cmdline
from .test_engines import CTX, spec, supervisor  # noqa: F401  (the fixture)


def flags(argv: list[str], *names: str) -> dict[str, str | None]:
    return {n: argv[argv.index(n) + 1] if n in argv else None for n in names}


@pytest.mark.parametrize(
    ("engine", "tp_flag", "pp_flag"),
    [("vllm", "-tp", "-pp"), ("sglang", "--tp-size", "--pp-size"), ("trtllm", "--tp_size", "--pp_size")],
)
def test_tp_and_pp_become_the_engines_own_flags(engine: str, tp_flag: str, pp_flag: str) -> None:
    # tp 2 x pp 2 on 4 GPUs: the engine is told 2 and 2, never "-tp 4" from the GPU count.
    argv = launch_plan(spec(engine, gpus=[0, 1, 2, 3], tp=2, pp=2), CTX).argv
    assert flags(argv, tp_flag, pp_flag) == {tp_flag: "2", pp_flag: "2"}
    assert argv.count(tp_flag) == 1 and argv.count(pp_flag) == 1
    # tp 4 alone: no pipeline flag at all (the engine's default, 1).
    argv = launch_plan(spec(engine, gpus=[0, 1, 2, 3], tp=4, pp=1), CTX).argv
    assert flags(argv, tp_flag, pp_flag) == {tp_flag: "4", pp_flag: None}
    # One GPU, tp 1: neither flag.
    argv = launch_plan(spec(engine, gpus=[0], tp=1, pp=1), CTX).argv
    assert flags(argv, tp_flag, pp_flag) == {tp_flag: None, pp_flag: None}


def test_a_controller_that_sends_no_tp_keeps_the_old_rule() -> None:
    argv = launch_plan(spec("vllm", gpus=[0, 1]), CTX).argv
    assert flags(argv, "-tp", "-pp") == {"-tp": "2", "-pp": None}


def test_args_that_disagree_with_the_profile_are_refused() -> None:
    with pytest.raises(SpecError, match=r"args\.tensor_parallel_size 4 disagrees with the profile's 2"):
        launch_plan(spec("vllm", gpus=[0, 1], tp=2, pp=1, args={"tensor_parallel_size": 4}), CTX)
    same = launch_plan(spec("vllm", gpus=[0, 1], tp=2, pp=1, args={"tensor_parallel_size": 2}), CTX).argv
    assert same.count("-tp") == 1


def test_llamacpp_refuses_tp_and_pp() -> None:
    with pytest.raises(SpecError, match="tensor parallelism"):
        launch_plan(spec("llamacpp", tp=2), CTX)
    with pytest.raises(SpecError, match="pipeline parallelism"):
        launch_plan(spec("llamacpp", pp=2), CTX)
    assert "-tp" not in launch_plan(spec("llamacpp", tp=1, pp=1), CTX).argv


@pytest.mark.integration
async def test_the_vllm_standin_is_started_with_tp_and_pp(
    supervisor: tuple[Supervisor, list[ShardStatus]],  # noqa: F811
    tmp_path: Path,
) -> None:
    sup, _ = supervisor
    weights = tmp_path / "weights"
    weights.mkdir()
    sup.start(spec("vllm", gpus=[0, 1, 2, 3], tp=2, pp=2, source=WeightSource(path=str(weights))))
    status = await wait_for(
        lambda: next((x for x in sup.statuses() if x.state in ("ready", "failed")), None), limit_s=20
    )
    assert status.state == "ready", status.last_output_lines
    assert status.pid is not None
    cmdline = read_cmdline(status.pid)
    assert "-tp 2" in cmdline and "-pp 2" in cmdline, cmdline
    assert any("vllm stand-in: tp=2 pp=2" in line for line in status.last_output_lines), status
    await sup.stop("r1")


MODEL = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: m}
spec:
  context_length: 4096
  source: {path: /models/m}
  profiles:
    - PROFILE
"""


@pytest.mark.parametrize(
    ("profile", "error"),
    [
        (
            "{name: a, engine: vllm, gpu_class: a100-80gb, gpus: 4, tp: 2}",
            "gpus x nodes (4 x 1) must equal tp x pp (2 x 1)",
        ),
        ("{name: a, engine: llamacpp, pp: 2}", "llama.cpp does not do pipeline parallelism (pp 2)"),
        ("{name: a, engine: llamacpp, tp: 2}", "llama.cpp does not do tensor parallelism (tp 2)"),
        (
            "{name: a, engine: sglang, gpu_class: a100-80gb, gpus: 2, tp: 2, pp: 2, nodes: 2}",
            "sglang replicas across nodes are not started by llmgw yet (nodes 2)",
        ),
    ],
)
def test_validate_refuses_parallelism_the_engine_cannot_be_given(
    tmp_path: Path, profile: str, error: str
) -> None:
    from llmgw.adapters.repo_files import load_repo

    (tmp_path / "m.yaml").write_text(MODEL.replace("PROFILE", profile))
    errors = [str(e) for e in load_repo(tmp_path).errors]
    assert any(error in e and "m.yaml:8:" in e for e in errors), errors
    (tmp_path / "m.yaml").write_text(
        MODEL.replace("PROFILE", "{name: a, engine: vllm, gpu_class: a100-80gb, gpus: 4, tp: 2, pp: 2}")
    )
    assert load_repo(tmp_path).ok
