"""`router_overhead.py --tracing`: what tracing costs the router, three builds interleaved in one run.

  without  - the router built without tracing: this tree with every tracing hook stripped from its syntax
             (benchmarks/untraced.py), run with PYTHONPATH naming the copy; `--baseline REV` takes a
             revision's sources instead (`git archive`), e.g. the commit before tracing was added — which
             differs from this tree by everything that landed since, so it no longer isolates tracing
  off      - this tree, no OTLP endpoint: the hooks are in, OpenTelemetry is not even imported
  on       - this tree exporting every request's spans over OTLP/HTTP to a sink in the mock (sampled: all)

Each round measures every target once per mode and concurrency, the order rotating each round so no target
always runs first or last on a machine whose load drifts; the medians over `--rounds` are compared. Printed: a
table (median req/s and CPU per request of each), the ratios to `without`, and the last line

  router_tracing: cpu_ratio_off_c16=X cpu_ratio_on_c16=X rps_ratio_off_c16=X rps_ratio_on_c16=X

(whole requests at concurrency 16, or the highest level asked for). The issue's bar: `off` within 5% of
`without`; `on` is reported.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Procs
from peers import Target, start_llmgw
from untraced import untraced_tree

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("without", "off", "on")


def _tree(rev: str, into: Path) -> Path:
    """The llmgw, router and agent sources of `rev`, unpacked under `into`."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "llmgw", "router", "agent"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True, timeout=120)
    return into


def _pythonpath(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=f"{tree}:{tree / 'router'}:{tree / 'agent'}")


def start(
    procs: Procs, work: Path, args: argparse.Namespace, upstream: str, cpus: str | None
) -> list[Target]:
    if args.baseline:
        print(f"without: the router at {args.baseline}", flush=True)
        baseline = _tree(args.baseline, work / "baseline")
    else:
        baseline, hooks = untraced_tree(ROOT, work / "baseline")
        print(
            f"without: this tree with its {hooks} tracing hooks stripped (benchmarks/untraced.py)", flush=True
        )
    state = ("--state-dir",)
    return [
        start_llmgw(
            procs,
            work / "without",
            upstream,
            cpus=cpus,
            name="without",
            extra=(*state, str(work / "without" / "state")),
            env=_pythonpath(baseline),
        ),
        start_llmgw(
            procs,
            work / "off",
            upstream,
            cpus=cpus,
            name="off",
            extra=(*state, str(work / "off" / "state")),
            env=_pythonpath(ROOT),
        ),
        start_llmgw(
            procs,
            work / "on",
            upstream,
            cpus=cpus,
            name="on",
            extra=(*state, str(work / "on" / "state"), "--otlp-endpoint", upstream),
            env=_pythonpath(ROOT),
        ),
    ]


def run(
    procs: Procs,
    work: Path,
    args: argparse.Namespace,
    levels: list[int],
    start_mock: Callable[[Procs, Path, str | None], str],
    measure: Callable[[Target, bool, int, int, str | None], Any],
    load_cpus: str | None,
) -> None:
    proxy_cpus = "0" if args.pin else None
    upstream = start_mock(procs, work, load_cpus)
    targets = start(procs, work, args, upstream, proxy_cpus)
    results: dict[tuple[str, bool, int], list[Any]] = {}
    for round_ in range(args.rounds):
        for stream in (False, True):
            for conns in levels:
                order = targets[round_ % 3 :] + targets[: round_ % 3]
                for t in order:
                    results.setdefault((t.name, stream, conns), []).append(
                        measure(t, stream, conns, args.duration, load_cpus)
                    )
    print(
        f"\n{'mode':<8}{'build':<9}{'conc':>5}{'req/s':>9}{'cpu us/req':>12}{'rps/without':>13}{'cpu/without':>13}"
    )
    medians: dict[tuple[str, bool, int], tuple[float, float]] = {}
    for key, runs in results.items():
        cpu = [r.cpu_us_per_req for r in runs if r.cpu_us_per_req is not None]
        medians[key] = (
            statistics.median(r.rps for r in runs),
            statistics.median(cpu) if cpu else float("nan"),
        )
    for stream in (False, True):
        for conns in levels:
            base_rps, base_cpu = medians[("without", stream, conns)]
            for name in NAMES:
                rps, cpu = medians[(name, stream, conns)]
                print(
                    f"{'stream' if stream else 'whole':<8}{name:<9}{conns:>5}{rps:>9.0f}{cpu:>12.0f}"
                    f"{rps / base_rps if base_rps else float('nan'):>13.3f}{cpu / base_cpu:>13.3f}"
                )
    errors = sum(r.errors for runs in results.values() for r in runs)
    if errors:
        print(f"  {errors} requests failed across the runs; their req/s counts them")
    c16 = 16 if 16 in levels else levels[-1]
    base_rps, base_cpu = medians[("without", False, c16)]
    (off_rps, off_cpu), (on_rps, on_cpu) = medians[("off", False, c16)], medians[("on", False, c16)]
    print(
        f"router_tracing: cpu_ratio_off_c{c16}={off_cpu / base_cpu:.3f} cpu_ratio_on_c{c16}={on_cpu / base_cpu:.3f} "
        f"rps_ratio_off_c{c16}={off_rps / base_rps:.3f} rps_ratio_on_c{c16}={on_rps / base_rps:.3f}"
    )
