"""The sim engine's command line (`llmgw-agent sim-engine`, `python -m llmgw_agent.sim`): its flags, and what
it gets wrong on purpose read from them.
"""

from __future__ import annotations

import argparse

from llmgw_agent.sim_model import parse_answers
from llmgw_agent.sim_parts import PROBES, Behaviour

__all__ = ["behaviour_from_args", "build_parser"]

_DESCRIPTION = (
    "The simulated engine: an OpenAI-compatible aiohttp server with a latency model and vLLM's metric names."
)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="llmgw-agent sim-engine", description=_DESCRIPTION)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", required=True, help="the model name it serves")
    p.add_argument(
        "--api-key-env", default="VLLM_API_KEY", help="environment variable holding the key (unset: no key)"
    )
    p.add_argument("--prefill-ms-per-token", type=float, default=1.0)
    p.add_argument("--decode-ms-per-token", type=float, default=10.0)
    p.add_argument("--max-concurrency", type=int, default=4)
    p.add_argument(
        "--prefix-cache", type=int, default=4096, help="cache capacity in blocks (0: no prefix cache)"
    )
    p.add_argument("--block-size", type=int, default=16, help="tokens per prefix-cache block")
    p.add_argument("--kv-capacity-tokens", type=int, default=65536)
    p.add_argument(
        "--kv-events-port",
        type=int,
        help="publish KV-cache events (vLLM's ZMQ format) on this port of --kv-events-host (unset: none)",
    )
    p.add_argument(
        "--kv-events-host",
        default="127.0.0.1",
        help="the address the KV-event publisher binds (default 127.0.0.1: it has no authentication, and the "
        "agent's pass-through relays it to key holders)",
    )
    p.add_argument("--hash-seed", default="0", help="the block hashes' root, as vLLM's PYTHONHASHSEED")
    p.add_argument(
        "--max-tokens-default",
        type=int,
        default=16,
        help="an answer's own length when the client sets no max_tokens (it then ends with `stop`)",
    )
    p.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="prompt plus answer at most: a longer prompt is refused, a longer answer cut (`length`)",
    )
    p.add_argument(
        "--judge-unsafe",
        action="append",
        default=None,
        metavar="WORD=S1,S9",
        help="answer completions as a Llama Guard 3 judge: unsafe (with these categories) when the judged "
        "conversation contains WORD, else safe; repeatable",
    )
    p.add_argument(
        "--load-ms",
        type=float,
        default=0.0,
        help="declared load time: the port is opened only after this long, as an engine loading weights",
    )
    p.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered 503 (0..1)")
    p.add_argument("--answers", default="", help="key=answer;...: a chat whose last message contains key")
    p.add_argument(
        "--fail-probes", default="", help=f"comma-separated probes to fail on purpose: {', '.join(PROBES)}"
    )
    return p


def behaviour_from_args(ns: argparse.Namespace) -> Behaviour:
    if not 0 <= ns.error_rate <= 1:
        raise SystemExit("--error-rate must be between 0 and 1")
    probes = frozenset(p.strip() for p in ns.fail_probes.split(",") if p.strip())
    unknown = sorted(probes - set(PROBES))
    if unknown:
        raise SystemExit(f"--fail-probes: unknown probe(s) {', '.join(unknown)}; known: {', '.join(PROBES)}")
    try:
        answers = parse_answers(ns.answers)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    return Behaviour(ns.error_rate, answers, probes)
