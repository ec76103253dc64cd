"""`llmgw plan --suggest` through the CLI (issue 50): on a saved live state, a capacity file and a trace it
proposes a fleet that its replay confirms, says why the alternatives lost and where its figures came from,
prints the same every time, and `--write` edits the Model file keeping its comments; `plan --simulate` shows
the fleets' costs and the objectives against the replay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.fleet.views import LiveGpu, LiveNode, LiveState
from llmgw.core.plan import catalog_documents
from llmgw.core.traffic.trace import TracedRequest, TraceHeader, format_trace

from .suggest_cases import bench_row

CLUSTER = """\
# The cluster: this comment stays.
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: suggest-test}
spec:
  controller: {address: "127.0.0.1:7070"}
  gpu_classes: {l4-24g: {memory_gb: 24}, h100-80g: {memory_gb: 80}}
  costs:
    gpu_per_hour: {l4-24g: 0.8, h100-80g: 3.0}  # list prices
"""
NODES = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: gpu-1}
spec: {address: 10.0.0.1}
"""
CHAT = """\
# chat: the interactive model (this comment stays)
apiVersion: llmgw/v1
kind: Model
metadata: {name: chat}
spec:
  context_length: 4096
  scaling: {min: 1, max: 1}   # set by hand, long ago
  slo:
    ttft_p99_ms: 800
    tpot_p99_ms: 40
  profiles:
    # the fast card first
    - {name: h100, engine: sim, gpu_class: h100-80g, gpus: 1, slots: 4}
    - name: l4
      engine: sim   # the cheap card
      gpu_class: l4-24g
      gpus: 1
      slots: 4
"""
CAPACITY = {"capacity": [bench_row("chat", "h100", 0.5, 10.0, 4), bench_row("chat", "l4", 1.5, 25.0, 4)]}


def live(root: Path, l4_cards: int) -> LiveState:
    loaded = load_repo(root)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    gpus = [LiveGpu(index=i, gpu_class="h100-80g") for i in range(4)]
    gpus += [LiveGpu(index=4 + i, gpu_class="l4-24g") for i in range(l4_cards)]
    return LiveState(
        revision="0ld0ld0ld0ld",
        taken_at=1_780_000_000.0,
        nodes=[LiveNode(name="gpu-1", cpu_cores=32, memory_bytes=64 << 30, gpus=gpus, engines={"sim": None})],
        replicas=[],
        models={"chat": loaded.repo.catalog.models["chat"].spec},
        documents=catalog_documents(loaded.repo.catalog),
    )


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "repo"
    (root / "models").mkdir(parents=True)
    (root / "cluster.yaml").write_text(CLUSTER)
    (root / "nodes.yaml").write_text(NODES)
    (root / "models" / "chat.yaml").write_text(CHAT)
    capacity = tmp_path / "capacity.json"
    capacity.write_text(json.dumps(CAPACITY))
    # 6 requests a second of 256 prompt and 100 completion tokens for 2 minutes, from two projects.
    requests = [
        TracedRequest(i / 6.0, "chat", "web" if i % 3 else "batch", 256, 100, stream=True) for i in range(720)
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(format_trace(TraceHeader(0.0, 120.0, "test"), requests)) + "\n")
    for cards in (8, 1):
        (tmp_path / f"state-{cards}.json").write_text(live(root, cards).model_dump_json())
    return {"root": root, "capacity": capacity, "trace": trace, "tmp": tmp_path}


def suggest(files: dict[str, Path], cards: int, *extra: str) -> tuple[int, str, str]:
    args = ["plan", str(files["root"]), "--state", str(files["tmp"] / f"state-{cards}.json"), "--suggest"]
    args += ["--capacity", str(files["capacity"]), "--trace", str(files["trace"]), *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.stdout, result.stderr


def test_the_cheapest_fleet_meeting_the_objectives_is_suggested_and_the_replay_confirms_it(
    files: dict[str, Path],
) -> None:
    code, out, err = suggest(files, 8)
    assert code == 0, (out, err)
    assert "Suggested fleet (objective cost):\n  chat: l4 (l4-24g) x 1..7, 5.60 USD/h" in out
    assert "suggested (chat: l4 x 7) | 5.60 |" in out and "| met" in out
    assert "l4-24g: 7 held of 8 (1 free)" in out
    assert "runner-up 1 (chat: h100 x 3) | 9.00 |" in out
    assert "chat: h100 (h100-80g) x 1..3: costs +3.40 per hour" in out
    assert "chat: l4 (l4-24g) x 1..6: objective missed: hour 0: needs 7 replicas" in out
    assert "chat/l4: bench on this profile" in out and "from costs.gpu_per_hour.l4-24g x 1" in out
    assert "exhaustive: 72 configurations, 72 weighed" in out
    assert "Not checked:\n  availability counts refusals only" in out


def test_a_limit_of_the_fleet_turns_the_suggestion_and_says_why(files: dict[str, Path]) -> None:
    code, out, _ = suggest(files, 1)
    assert code == 0, out
    assert "chat: h100 (h100-80g) x 1..3, 9.00 USD/h" in out
    assert "chat: l4 (l4-24g) x 1..7: l4-24g: needs 7 at hour 0, the fleet has 1" in out


def test_the_same_trace_and_seed_give_the_same_suggestion(files: dict[str, Path]) -> None:
    assert suggest(files, 8)[1] == suggest(files, 8)[1]


def test_write_edits_the_model_in_place_keeping_comments_and_layout(files: dict[str, Path]) -> None:
    path = files["root"] / "models" / "chat.yaml"
    code, _, err = suggest(files, 8, "--write")
    assert code == 0, err
    assert "--write: edited" in err and "chat.yaml" in err
    written = path.read_text()
    expected = CHAT.replace("{min: 1, max: 1}", "{min: 1, max: 7}")
    h100 = "    - {name: h100, engine: sim, gpu_class: h100-80g, gpus: 1, slots: 4}\n"
    expected = expected.replace(h100, "").replace("      slots: 4\n", "      slots: 4\n" + h100)
    assert written == expected
    loaded = load_repo(files["root"])
    assert loaded.ok and loaded.repo is not None
    spec = loaded.repo.catalog.models["chat"].spec
    assert (spec.scaling.min, spec.scaling.max, spec.profiles[0].name) == (1, 7, "l4")
    _, again, err = suggest(files, 8, "--write")
    assert "chat: l4 (l4-24g) x 1..7" in again
    assert "--write: edited nothing (the repo already runs it)" in err
    assert path.read_text() == written


def test_the_pr_comment_carries_the_diff_the_replay_table_and_a_chart(files: dict[str, Path]) -> None:
    code, out, _ = suggest(files, 8, "--format", "markdown")
    assert code == 0, out
    assert "#### Suggested fleet" in out
    assert "```diff\n--- a/" in out and "-  scaling: {min: 1, max: 1}   # set by hand, long ago" in out
    assert "+  scaling: {min: 1, max: 7}   # set by hand, long ago" in out
    assert (
        "| candidate | cost/h | p90 TTFT ms | p99 TTFT ms |" in out
        and "| suggested (chat: l4 x 7) | 5.60 |" in out
    )
    chart = out[out.index("```mermaid") :]
    assert "xychart-beta" in chart and 'x-axis "USD per hour" ["5.60", "9.00"]' in chart
    assert "line [100, 100]" in chart


def test_simulate_says_what_the_fleets_cost_and_which_objectives_the_replay_met(
    files: dict[str, Path],
) -> None:
    args = ["plan", str(files["root"]), "--state", str(files["tmp"] / "state-8.json"), "--simulate"]
    args += ["--capacity", str(files["capacity"]), "--trace", str(files["trace"])]
    result = CliRunner().invoke(app, args)
    out = result.stdout
    assert "Cost of the current fleet: 0.00 USD/h (0 replicas)" in out
    assert "Cost of the planned fleet: 3.00 USD/h, " in out and "USD per million tokens (1 replicas)" in out
    assert "Objectives on the planned fleet (replay; docs/gitops.md, Suggested fleets):" in out
    assert "  chat (web) ttft_p99_ms " in out and ": MISSED" in out  # one h100 for 6 requests a second
    assert "  chat (batch) tpot_p99_ms " in out


def test_a_profile_nobody_measured_is_said_to_be_assumed(files: dict[str, Path]) -> None:
    files["capacity"].write_text(json.dumps({"capacity": CAPACITY["capacity"][:1]}))  # chat/h100 only
    code, out, _ = suggest(files, 8)
    assert code == 0, out
    assert "chat/h100: bench on this profile" in out
    assert "chat/l4: assumption: chat/l4: not measured (`llmgw bench MODEL --profile P --save`)" in out


def test_the_latency_objective_buys_the_fast_cards(files: dict[str, Path]) -> None:
    code, out, _ = suggest(files, 8, "--objective", "latency")
    assert code == 0, out
    assert "Suggested fleet (objective latency):\n  chat: h100 (h100-80g)" in out


def test_beside_json_the_suggestion_goes_to_stderr_and_stdout_stays_one_document(
    files: dict[str, Path],
) -> None:
    code, out, err = suggest(files, 8, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["summary"] is not None
    assert "Suggested fleet (objective cost):" in err and "Suggested fleet" not in out


def test_a_fleet_with_an_unpriced_class_has_an_unknown_cost_never_zero(files: dict[str, Path]) -> None:
    cluster = files["root"] / "cluster.yaml"
    cluster.write_text(cluster.read_text().replace("{l4-24g: 0.8, h100-80g: 3.0}", "{l4-24g: 0.8}"))
    args = ["plan", str(files["root"]), "--state", str(files["tmp"] / "state-8.json"), "--simulate"]
    args += ["--capacity", str(files["capacity"]), "--trace", str(files["trace"])]
    out = CliRunner().invoke(app, args).stdout
    assert "Cost of the planned fleet: cost unknown: no price for chat/h100 (the Cluster's costs)" in out
