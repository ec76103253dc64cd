"""`llmgw-agent` command line: `run` (the daemon), `sim-engine` (the simulated engine)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    from llmgw_agent import daemon, sim_cli

    parser = argparse.ArgumentParser(prog="llmgw-agent", description="llmgw node agent")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the agent daemon")
    daemon.add_arguments(run)
    sim_cli.build_parser(sub.add_parser("sim-engine", help="run the simulated OpenAI-compatible engine"))
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    from llmgw_agent import daemon, sim

    ns = build_parser().parse_args(argv)
    if ns.command == "sim-engine":
        sim.run(ns)
    else:
        daemon.run_from_args(ns)


if __name__ == "__main__":
    main()
