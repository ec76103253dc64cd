"""vLLM's CPU build as the agent starts it: the module entry (the build's `vllm` script fails), eager mode (its
compile cache does not reload), the named block hash and seed a router recomputes, and cores of its own per
replica (vLLM's `auto` binds every replica to core 0). The real engine runs in tests/**/test_vllm_real*.py;
these are the command lines, and two stand-in replicas started by the real supervisor."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from llmgw_agent import engines
from llmgw_agent.engine_process import proc_start_time
from llmgw_agent.engines import LaunchContext, launch_plan, pick_cpus, runs_as_module, vllm_omp_threads_bind
from llmgw_agent.installs import DEFAULT_BINARY, InstallError, probe, probe_argv
from llmgw_agent.protocol import KvEventsRequest, ShardSpec, ShardStatus
from llmgw_agent.shards import Shard
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from support import free_port_range, wait_for

from .helpers import group_alive

STANDINS = Path(__file__).parent / "standins"
ENV_PYTHON = "/state/engines/vllm-0.32.0-0123456789ab/env/bin/python"


def spec(**kw: object) -> ShardSpec:
    base: dict[str, object] = {"replica_id": "r1", "model": "tiny", "engine": "vllm", "api_key": "k"}
    return ShardSpec.model_validate(base | kw)


def ctx(binary: str | None = ENV_PYTHON, **kw: object) -> LaunchContext:
    return LaunchContext("127.0.0.1", 20001, "/models/tiny", "/w", binary, **kw)  # type: ignore[arg-type]


def test_an_installed_vllm_runs_as_the_module_of_its_environments_python() -> None:
    assert DEFAULT_BINARY["vllm"] == "bin/python"  # what an install reports when the order names no binary
    plan = launch_plan(spec(served_model_name="tiny-chat"), ctx())
    assert plan.argv[:5] == [
        ENV_PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/tiny",
    ]
    assert plan.argv[5:7] == ["--served-model-name", "tiny-chat"] and "serve" not in plan.argv
    # A declared `vllm` script (a GPU node's CUDA build, the stand-in) keeps `vllm serve MODEL`.
    assert launch_plan(spec(), ctx("/opt/vllm/bin/vllm")).argv[:3] == [
        "/opt/vllm/bin/vllm",
        "serve",
        "/models/tiny",
    ]
    assert [runs_as_module(b) for b in ("python", "/e/bin/python3", "/e/bin/python3.11", "/e/bin/vllm")] == [
        True,
        True,
        True,
        False,
    ]


def test_its_probe_imports_vllm_where_a_script_is_asked_its_version() -> None:
    assert probe_argv("vllm", ENV_PYTHON) == [ENV_PYTHON, "-c", "import vllm; print(vllm.__version__)"]
    assert probe_argv("vllm", "/opt/vllm/bin/vllm") == ["/opt/vllm/bin/vllm", "--version"]


def test_on_cpu_it_runs_eager_on_gpus_it_compiles_unless_told() -> None:
    assert "--enforce-eager" in launch_plan(spec(), ctx()).argv
    assert "--enforce-eager" not in launch_plan(spec(gpus=[0]), ctx()).argv
    assert "--enforce-eager" in launch_plan(spec(gpus=[0], args={"enforce_eager": True}), ctx()).argv
    assert "--enforce-eager" not in launch_plan(spec(args={"enforce_eager": False}), ctx()).argv


def test_block_hashes_are_named_and_seeded_as_the_router_recomputes_them() -> None:
    plan = launch_plan(spec(kv_events=KvEventsRequest(hash_seed="1234")), ctx(kv_events=("127.0.0.1", 20002)))
    algo = plan.argv[plan.argv.index("--prefix-caching-hash-algo") + 1]
    assert (
        algo == engines.VLLM_PREFIX_HASH_ALGO == "sha256"
    )  # the router's vllm_block_hashes: sha256 of pickle
    assert plan.env["PYTHONHASHSEED"] == "1234"


def test_each_replica_binds_the_cores_it_was_given() -> None:
    assert launch_plan(spec(), ctx(cpus=(1,))).env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert launch_plan(spec(), ctx(cpus=(2, 3))).env["VLLM_CPU_OMP_THREADS_BIND"] == "2,3"
    # One list per local rank (tensor parallel on CPU), as vLLM reads it.
    assert launch_plan(spec(tp=2), ctx(cpus=(0, 1, 2, 3))).env["VLLM_CPU_OMP_THREADS_BIND"] == "0,1|2,3"
    # No cores given, or fewer than ranks, or the profile binds itself, or GPUs: the agent sets nothing.
    assert "VLLM_CPU_OMP_THREADS_BIND" not in launch_plan(spec(), ctx()).env
    assert vllm_omp_threads_bind((0,), 2) is None
    own = launch_plan(spec(env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"}), ctx(cpus=(1,)))
    assert "VLLM_CPU_OMP_THREADS_BIND" not in own.env  # the profile's own value stands (engine_environment)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in launch_plan(spec(gpus=[0]), ctx(cpus=(1,))).env


def test_cores_go_to_the_least_held_first() -> None:
    assert pick_cpus([0, 1], [], 1) == (0,)
    assert pick_cpus([0, 1], [0], 1) == (1,)  # a second replica: the other core
    assert pick_cpus([0, 1], [0, 1], 1) == (0,)  # a third shares, evenly
    assert pick_cpus([0, 1, 2, 3], [0, 1], 2) == (2, 3)
    assert pick_cpus([4, 5, 6], [5], 2) == (4, 6)  # the cores the agent may use, not 0..n
    assert pick_cpus([0, 1], [], 4) == (0, 1)  # never more than the node has


@pytest.fixture
async def supervisor(tmp_path: Path) -> AsyncIterator[Supervisor]:
    ports = free_port_range(20)
    cfg = SupervisorConfig(
        state_dir=tmp_path / "state",
        advertise_host="127.0.0.1",
        bind_host="127.0.0.1",
        port_range=(ports, ports + 19),
        engine_binaries={"vllm": str(STANDINS / "vllm")},
        ready_timeout_s=30,
        stop_grace_s=5,
        poll_interval_s=0.05,
    )
    sup = Supervisor(cfg, lambda status: None)
    yield sup
    await sup.stop_all()
    await sup.close()


def _engine_environ(pgid: int) -> dict[str, str]:
    """The environment of the vLLM stand-in in process group `pgid` (behind the agent's pass-through)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if (
                os.getpgid(int(pid)) != pgid
                or b"standins/vllm" not in Path(f"/proc/{pid}/cmdline").read_bytes()
            ):
                continue
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except (OSError, ProcessLookupError):
            continue
        return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)
    raise AssertionError(f"no vLLM stand-in in process group {pgid}")


@pytest.mark.integration
async def test_two_replicas_started_by_the_supervisor_bind_different_cores(supervisor: Supervisor) -> None:
    usable = sorted(os.sched_getaffinity(0))
    for replica in ("a", "b"):
        supervisor.start(spec(replica_id=replica, cpu_cores=1))

    def both_ready() -> list[ShardStatus] | None:
        statuses = supervisor.statuses()
        failed = [s for s in statuses if s.state == "failed"]
        assert not failed, failed[0].last_output_lines
        return statuses if len(statuses) == 2 and all(s.state == "ready" for s in statuses) else None

    statuses = await wait_for(both_ready, limit_s=30)
    binds = []
    for status in statuses:
        assert status.pid is not None
        binds.append(_engine_environ(status.pid)["VLLM_CPU_OMP_THREADS_BIND"])
    assert all(int(b) in usable for b in binds)
    if len(usable) >= 2:
        assert binds[0] != binds[1], binds  # vLLM's own `auto` would have bound both to the same core
    pids = [s.pid for s in statuses]
    await supervisor.stop_all()
    assert not any(group_alive(p) for p in pids if p is not None)


async def test_a_restarted_agent_keeps_the_cores_it_gave_and_gives_the_next_replica_others(
    tmp_path: Path,
) -> None:
    """The cores are in the shard's state record: an adopted vLLM keeps its cores, and one started after it by
    the new agent binds others. This process stands in for the engine (same pid and start time)."""
    usable = sorted(os.sched_getaffinity(0))
    state = tmp_path / "state"
    (state / "shards").mkdir(parents=True)
    me = os.getpid()
    held = spec(replica_id="held")
    status = ShardStatus(replica_id="held", model="tiny", engine="vllm", state="ready", pid=me)
    record = {
        "spec": held.model_dump(mode="json", exclude={"api_key"}),
        "status": status.model_dump(mode="json"),
        "pid": me,
        "pgid": me,
        "start_ticks": proc_start_time(me),
        "cpus": [usable[0]],
    }
    (state / "shards" / "held-0.json").write_text(json.dumps(record))
    sup = Supervisor(SupervisorConfig(state_dir=state, advertise_host="127.0.0.1"), lambda _: None)
    try:
        (adopted,) = sup.adopt()
        assert sup.shards[held.shard_id].cpus == (usable[0],)
        nxt = Shard(spec(replica_id="next"), adopted, tmp_path / "w")
        expected = (usable[1],) if len(usable) > 1 else (usable[0],)
        assert sup._pick_cpus(nxt) == expected
    finally:
        await sup.close()  # never told to stop: this process is the "engine"


async def test_an_import_probe_has_the_time_an_import_of_torch_takes(tmp_path: Path) -> None:
    """A python that takes 2 s to import its package passes a probe given 1 s: the floor is an import's."""
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nsleep 2\necho 0.32.0\n")
    slow.chmod(0o755)
    assert await probe("vllm", str(slow), 1.0) == ["0.32.0"]
    script = tmp_path / "vllm"
    script.write_text("#!/bin/sh\nsleep 2\necho 0.32.0\n")
    script.chmod(0o755)
    with pytest.raises(InstallError, match="did not finish within 1s"):
        await probe("vllm", str(script), 1.0)  # `vllm --version` keeps the order's own timeout
