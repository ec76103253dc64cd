"""`llmgw plan --simulate` through the CLI on a small repo and a saved live state: a change that halves a model's
replicas under a trace the two carry is a regression (exit 3), thresholds the repo declares decide, what nobody
measured is said, and a broken trace or capacity file is an error that says where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.fleet.views import LiveNode, LiveReplica, LiveShard, LiveState, model_views
from llmgw.core.plan import catalog_documents
from llmgw.core.traffic.trace import TracedRequest, TraceHeader, format_trace

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: replay-test}
spec:
  controller: {address: "127.0.0.1:7070"}%s
"""
NODE = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: cpu-1}
spec: {address: 10.0.0.1}
"""


def chat_model(replicas: int) -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: chat}}
spec:
  context_length: 4096
  scaling: {{min: {replicas}, max: {replicas}}}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1, slots: 2}}
"""


# What `llmgw bench chat --save` stored: 64 ms to the first token alone at 128 prompt tokens (16 ms at the short
# step's 32: 0.5 ms per token), 10 ms between tokens; at concurrency 2 it completed what two slots side by
# side do (48 requests of 33 tokens in 9.984 s: prefills that hold nothing up).
CAPACITY = {
    "capacity": [
        {
            "model": "chat",
            "profile": "sim",
            "gpu_class": None,
            "source": "measured",
            "assumed_slots": 2,
            "measured": {
                "concurrency": 2,
                "prefill_ms_per_token": 0.5,
                "decode_ms_per_token": 10.0,
                "curve": [
                    {
                        "concurrency": 1,
                        "requests": 40,
                        "failed": 0,
                        "seconds": 10.0,
                        "ttft_p50_ms": 64.0,
                        "itl_p50_ms": 10.0,
                        "tokens_per_s": 132.0,
                        "prompt_tokens": 128.0,
                    },
                    {
                        "concurrency": 1,
                        "requests": 40,
                        "failed": 0,
                        "seconds": 10.0,
                        "ttft_p50_ms": 16.0,
                        "itl_p50_ms": 10.0,
                        "tokens_per_s": 132.0,
                        "prompt_tokens": 32.0,
                    },
                    {
                        "concurrency": 2,
                        "requests": 48,
                        "failed": 0,
                        "seconds": 9.984,
                        "ttft_p50_ms": 70.0,
                        "itl_p50_ms": 11.0,
                        "tokens_per_s": 158.654,
                        "prompt_tokens": 128.0,
                    },
                ],
            },
        }
    ]
}


def write_repo(root: Path, replicas: int, cluster_extra: str = "") -> Path:
    (root / "models").mkdir(parents=True, exist_ok=True)
    (root / "cluster.yaml").write_text(CLUSTER % cluster_extra)
    (root / "nodes.yaml").write_text(NODE)
    (root / "models" / "chat.yaml").write_text(chat_model(replicas))
    return root


def live_with_two(root: Path) -> LiveState:
    """The fleet running two ready replicas of `chat` as the repo at `root` declares it."""
    loaded = load_repo(root)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    views = model_views(loaded.repo.catalog)
    fingerprint = views["chat"].fingerprints["sim"]
    return LiveState(
        revision="0ld0ld0ld0ld",
        taken_at=1_780_000_000.0,
        nodes=[LiveNode(name="cpu-1", cpu_cores=4, memory_bytes=8 << 30, gpus=[], engines={"sim": None})],
        replicas=[
            LiveReplica(
                id=f"chat-{i}",
                model="chat",
                profile="sim",
                fingerprint=fingerprint,
                shards=[LiveShard(node="cpu-1", state="ready")],
                state="ready",
            )
            for i in (1, 2)
        ],
        models={"chat": views["chat"].spec},
        documents=catalog_documents(loaded.repo.catalog),
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    applied = write_repo(tmp_path / "applied", 2)
    state = tmp_path / "state.json"
    state.write_text(live_with_two(applied).model_dump_json())
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps(CAPACITY))
    # 128-token prompts, 100-token answers: about 1.1 s each, 2 slots a replica. 2.5 requests a second is
    # about 70% of two replicas and 140% of one.
    requests = [TracedRequest(i * 0.4, "chat", "p", 128, 100, stream=True) for i in range(300)]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(format_trace(TraceHeader(0.0, 120.0, "test"), requests)) + "\n")
    return {"state": state, "capacity": capacity, "trace": trace, "root": tmp_path}


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_halving_a_busy_model_is_a_regression_with_exit_3(files: dict[str, Path]) -> None:
    planned = write_repo(files["root"] / "planned", 1)
    code, out, err = run(
        "plan",
        str(planned),
        "--state",
        str(files["state"]),
        "--trace",
        str(files["trace"]),
        "--capacity",
        str(files["capacity"]),
    )
    assert code == 3, (out, err)
    assert "- stop chat-" in out  # the plan itself is printed first
    assert f"Simulated serving (virtual time, trace {files['trace']}: 300 requests):" in out
    current, planned_row = (line for line in out.splitlines() if line.startswith(("  current", "  planned")))
    assert "refused 0/300" in current and "utilization" in current
    assert "refused 0/300" not in planned_row
    assert "model chat: refused 0.0% ->" in out
    assert "spec.plan.simulate.max_refusals_increase is 1%" in out
    assert "Assumed (not measured)" not in out  # the capacity file measured chat/sim
    assert "the planned fleet regresses" in err


def test_the_same_fleet_is_no_regression(files: dict[str, Path]) -> None:
    same = write_repo(files["root"] / "same", 2)
    code, out, _ = run(
        "plan",
        str(same),
        "--state",
        str(files["state"]),
        "--trace",
        str(files["trace"]),
        "--capacity",
        str(files["capacity"]),
    )
    assert code == 0, out
    current, planned = (line for line in out.splitlines() if line.startswith(("  current", "  planned")))
    assert current.replace("current", "planned") == planned  # one trace, one seed: the same replay
    assert "No regression past spec.plan.simulate's thresholds." in out


def test_thresholds_the_repo_declares_decide(files: dict[str, Path]) -> None:
    lax = "\n  plan: {simulate: {max_p99_ttft_increase: 100000%, max_refusals_increase: 100%}}"
    planned = write_repo(files["root"] / "lax", 1, lax)
    code, out, _ = run(
        "plan",
        str(planned),
        "--state",
        str(files["state"]),
        "--trace",
        str(files["trace"]),
        "--capacity",
        str(files["capacity"]),
    )
    assert code == 0, out
    assert "No regression" in out


def test_a_malformed_threshold_is_a_validation_error(files: dict[str, Path]) -> None:
    planned = write_repo(files["root"] / "bad", 1, "\n  plan: {simulate: {max_p99_ttft_increase: twenty}}")
    code, _, err = run("plan", str(planned), "--state", str(files["state"]), "--simulate")
    assert code == 1
    assert "cluster.yaml:6:" in err and "spec.plan.simulate.max_p99_ttft_increase" in err


def test_without_a_trace_a_synthetic_one_and_without_measurements_the_assumptions(
    files: dict[str, Path],
) -> None:
    same = write_repo(files["root"] / "same", 2)
    code, out, _ = run("plan", str(same), "--state", str(files["state"]), "--simulate")
    assert code == 0, out
    assert "a synthetic trace: 50% of the current fleet's modelled capacity per model for 10 minutes" in out
    assert "Assumed (not measured):" in out
    assert "chat/sim: not measured (`llmgw bench MODEL --profile P --save`): assumed prefill" in out


def test_a_trace_or_capacity_file_that_cannot_be_read_is_an_error(files: dict[str, Path]) -> None:
    same = write_repo(files["root"] / "same", 2)
    bad = files["root"] / "bad.jsonl"
    bad.write_text('{"llmgw_trace": 9}\n')
    code, _, err = run("plan", str(same), "--state", str(files["state"]), "--trace", str(bad))
    assert code == 1 and f"trace {bad}: line 1: not an llmgw trace of version 1" in err
    code, _, err = run(
        "plan", str(same), "--state", str(files["state"]), "--simulate", "--capacity", str(files["trace"])
    )
    assert code == 1 and "not the output of `llmgw capacity --json`" in err


def test_a_line_of_the_trace_that_does_not_parse_is_named_and_skipped(files: dict[str, Path]) -> None:
    same = write_repo(files["root"] / "same", 2)
    trace = files["trace"]
    trace.write_text(trace.read_text() + '{"t": -1, "model": "chat"}\n')
    code, out, _ = run(
        "plan",
        str(same),
        "--state",
        str(files["state"]),
        "--trace",
        str(trace),
        "--capacity",
        str(files["capacity"]),
    )
    assert code == 0, out
    assert f"trace {trace}: line 302: t must be a number at or above 0 (got -1) (skipped)" in out


def test_json_stays_one_document_and_markdown_fences_the_section(files: dict[str, Path]) -> None:
    planned = write_repo(files["root"] / "planned", 1)
    common = [
        "--state",
        str(files["state"]),
        "--trace",
        str(files["trace"]),
        "--capacity",
        str(files["capacity"]),
    ]
    code, out, err = run("plan", str(planned), *common, "--format", "json")
    assert code == 3
    assert json.loads(out)["replicas"]["stop"]  # stdout parses: the section went to stderr
    assert "Simulated serving" in err and "Regressions (2):" in err
    code, out, _ = run("plan", str(planned), *common, "--format", "markdown", "--detailed-exitcode")
    assert code == 3  # a regression wins over "changes" (2)
    assert out.startswith("### llmgw plan")
    section = out[out.index("#### Simulated serving") :]
    assert section.startswith("#### Simulated serving\n\n```text\nSimulated serving (virtual time, trace ")
    assert section.rstrip().endswith("```")
