"""The request path's budgets (benchmarks/request_path_cost.py): a stage 5 % over what its budget allows fails
the benchmark, named; counts at their budgets pass. Run on recorded counts (the comparison is a pure function
of them); the measurement itself under callgrind is .ci/run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from request_path_cost import (  # noqa: E402
    BUDGETS,
    MODES,
    NOISE_FLOOR,
    STAGES,
    budgets_for,
    over_budget,
    stage_counts,
)


def committed_budgets() -> dict[str, dict[str, int]]:
    return json.loads(BUDGETS.read_text())


def test_every_stage_of_both_answers_has_a_budget_line() -> None:
    budgets = committed_budgets()
    assert sorted(budgets) == sorted(MODES)
    for mode in MODES:
        assert list(budgets[mode]) == list(STAGES), mode
        assert all(isinstance(v, int) and v > 0 for v in budgets[mode].values()), budgets[mode]


def test_stages_are_the_differences_of_the_cumulative_counts_and_add_up_to_the_total() -> None:
    per = {
        m: {s: 1000.0 * (i + 1) + (7 if m == "stream" else 0) for i, s in enumerate(STAGES)} for m in MODES
    }
    stages = stage_counts(per)
    for mode in MODES:
        assert stages[mode]["core"] == round(per[mode]["core"])
        assert all(stages[mode][s] == 1000 for s in STAGES[1:])
        assert sum(stages[mode].values()) == round(per[mode][STAGES[-1]])


def test_a_budget_is_the_measured_count_plus_ten_percent_or_the_noise_floor() -> None:
    stages = {m: {s: 100_000 + 1000 * i for i, s in enumerate(STAGES)} for m in MODES}
    stages["whole"]["admission"] = -400  # a stage that costs nothing measures as noise around zero
    stages["whole"]["trace_noexp"] = 5_000
    budgets = budgets_for(stages)
    for mode in MODES:
        for stage, count in stages[mode].items():
            if count >= 10 * NOISE_FLOOR * stages[mode]["core"]:
                assert count < budgets[mode][stage] <= count * 1.1 + 1
    floor = 0.01 * stages["whole"]["core"]  # 1,000 instructions here
    assert budgets["whole"]["admission"] == -400 + floor
    assert budgets["whole"]["trace_noexp"] == 5_000 + floor
    assert over_budget(stages, budgets) == []


@pytest.mark.parametrize("stage", ["guard_in", "usage"])
def test_a_stage_five_percent_over_its_budget_fails_the_benchmark_naming_it(
    tmp_path: Path, stage: str
) -> None:
    budgets = committed_budgets()
    at_budget = {"stages": budgets, "off": {m: budgets[m]["core"] for m in MODES}}
    over = json.loads(json.dumps(at_budget))
    over["stages"]["stream"][stage] = round(budgets["stream"][stage] * 1.05)
    script = [sys.executable, str(ROOT / "benchmarks" / "request_path_cost.py"), "--counts"]

    (tmp_path / "at.json").write_text(json.dumps(at_budget))
    passed = subprocess.run([*script, str(tmp_path / "at.json")], capture_output=True, text=True, timeout=60)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert passed.stdout.rstrip().endswith(" over=0"), passed.stdout

    (tmp_path / "over.json").write_text(json.dumps(over))
    failed = subprocess.run(
        [*script, str(tmp_path / "over.json")], capture_output=True, text=True, timeout=60
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"over budget: stream/{stage}: " in failed.stdout, failed.stdout
    assert failed.stdout.rstrip().endswith(" over=1"), failed.stdout
    assert over_budget(over["stages"], budgets) == [
        line.removeprefix("over budget: ")
        for line in failed.stdout.splitlines()
        if line.startswith("over budget")
    ]


def test_a_stage_without_a_budget_line_is_over() -> None:
    budgets = committed_budgets()
    stages = json.loads(json.dumps(budgets))
    stages["whole"]["new_stage"] = 1
    assert over_budget(stages, budgets) == [
        "whole/new_stage: 1 has no budget line in request_path_budget.json"
    ]


def test_the_floor_line_gives_llmgw_over_the_floor_and_what_the_listener_and_client_add(
    tmp_path: Path,
) -> None:
    budgets = committed_budgets()
    servers = {
        "floor": {"whole": 500_000, "stream": 600_000},
        "llmgw": {"whole": 1_250_000, "stream": 1_800_000},
    }
    counts = {"stages": budgets, "off": {m: budgets[m]["core"] for m in MODES}, "servers": servers}
    (tmp_path / "counts.json").write_text(json.dumps(counts))
    script = [sys.executable, str(ROOT / "benchmarks" / "request_path_cost.py"), "--counts"]
    done = subprocess.run(
        [*script, str(tmp_path / "counts.json")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "request_path_floor: instr_ratio_whole=2.50 instr_ratio_stream=3.00 spread=none" in (
        done.stdout.splitlines()
    )
    listener = next(line for line in done.stdout.splitlines() if "of which listener+client" in line).split()
    # llmgw-router runs every check on: the in-process stages up to the kept bodies, which it does not keep.
    in_process = {m: sum(v for k, v in budgets[m].items() if k != "bodies") for m in MODES}
    assert listener[3:5] == [f"{1_250_000 - in_process['whole']:,}", f"{1_800_000 - in_process['stream']:,}"]
    assert done.stdout.rstrip().endswith(" over=0"), done.stdout  # the budgets' line stays the last


def test_several_runs_give_their_medians_ratio_and_the_spread(tmp_path: Path) -> None:
    budgets = committed_budgets()
    runs = [
        {"floor": {"whole": 500_000, "stream": 600_000}, "llmgw": {"whole": 1_000_000, "stream": 1_200_000}},
        {"floor": {"whole": 505_000, "stream": 600_000}, "llmgw": {"whole": 1_010_000, "stream": 1_200_000}},
        {"floor": {"whole": 510_000, "stream": 600_000}, "llmgw": {"whole": 1_020_000, "stream": 1_200_000}},
    ]
    counts = {"stages": budgets, "off": {m: budgets[m]["core"] for m in MODES}, "servers": runs}
    (tmp_path / "counts.json").write_text(json.dumps(counts))
    script = [sys.executable, str(ROOT / "benchmarks" / "request_path_cost.py"), "--counts"]
    done = subprocess.run(
        [*script, str(tmp_path / "counts.json")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # The medians' ratio (1,010,000 / 505,000); the spread: the floor's whole, (510,000 - 500,000) / 505,000.
    assert "request_path_floor: instr_ratio_whole=2.00 instr_ratio_stream=2.00 spread=2.0%" in lines
    assert [line.split(":")[0] for line in lines if line.startswith("run ")] == ["run 1", "run 2", "run 3"]
