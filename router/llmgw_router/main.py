"""`llmgw-router`: the OpenAI-compatible router as a process.

Fed by the controller's stream (`--controller ADDR`) or a static snapshot file (`--snapshot FILE`, JSON or
YAML holding a RouterSnapshot). Keys come from the store (`--store DSN`), a file of hashes (`--keys-file`), or
nowhere (`--no-auth`, loudly). `build_parser` and `run` are what `llmgw router` reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmgw.publish import RouterSnapshot
from llmgw_router.app import serve
from llmgw_router.auth import Authenticator, KeyStore, StaticKeys, StoreKeys
from llmgw_router.link import ControllerLink, controller_url
from llmgw_router.ports import UsageSink
from llmgw_router.ratelimit import Limiter, TenantLimiter, memory_limiter
from llmgw_router.service import Router, RouterOptions

__all__ = ["build_parser", "load_snapshot_file", "main", "run"]

log = logging.getLogger("llmgw_router")


def load_snapshot_file(path: str | Path) -> RouterSnapshot:
    """A RouterSnapshot from a .json, .yaml or .yml file; ValueError naming the file when it is not one."""
    p = Path(path)
    text = p.read_text()
    try:
        if p.suffix in (".yaml", ".yml"):
            from ruamel.yaml import YAML

            raw: Any = YAML(typ="safe").load(text)
        else:
            raw = json.loads(text)
        return RouterSnapshot.model_validate(raw)
    except Exception as exc:  # every parse or validation error becomes one clear message
        raise ValueError(f"{p}: not a router snapshot: {exc}") from None


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="llmgw-router", description=__doc__)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--controller",
        metavar="ADDR",
        action="append",
        help="controller address (host:port or ws:// URL); repeat for standby controllers, tried in turn",
    )
    source.add_argument("--snapshot", metavar="FILE", help="static RouterSnapshot file (JSON or YAML)")
    p.add_argument(
        "--listen", help="host:port of the OpenAI API (default: the snapshot's, else 127.0.0.1:8080)"
    )
    p.add_argument(
        "--metrics-listen", help="host:port of /metrics (default: the snapshot's, else 127.0.0.1:9091)"
    )
    p.add_argument("--store", metavar="DSN", help="store DSN: keys, pooled limits and usage")
    p.add_argument("--keys-file", metavar="FILE", help="with no store: lines of `SHA256HEX PROJECT [KEY_ID]`")
    p.add_argument("--no-auth", action="store_true", help="serve without API keys (development only)")
    p.add_argument("--token-file", metavar="FILE", help="token presented to the controller")
    p.add_argument(
        "--debug-token-file", metavar="FILE", help="requests sending this in x-llmgw-debug get the decision"
    )
    p.add_argument(
        "--router-id", default=socket.gethostname(), help="name of this router in usage and reports"
    )
    p.add_argument(
        "--on-demand-wait", type=float, default=5.0, help="seconds a request waits for an on-demand load"
    )
    p.add_argument(
        "--write-timeout",
        type=float,
        default=30.0,
        help="seconds a streaming client may accept no bytes before it is cut off and its slot freed",
    )
    p.add_argument(
        "--request-deadline",
        type=float,
        default=3600.0,
        help="seconds an engine's whole answer may take (besides the idle read timeout)",
    )
    p.add_argument(
        "--limits-clock-offset",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="testing only: the rate-limit windows' clock runs SECONDS ahead of this machine's (tests start "
        "at a window's start instead of sleeping until one comes); never set it in production",
    )
    p.add_argument("--log-level", default="INFO")
    return p


def limits_clock(offset_s: float) -> Callable[[], float]:
    """The clock the limiter's fixed windows are read on: the wall clock, shifted only when a test asks."""
    if offset_s == 0.0:
        return time.time
    log.warning(
        "rate-limit windows run %+.3fs off the wall clock (--limits-clock-offset: testing only)", offset_s
    )
    return lambda: time.time() + offset_s


def _read_secret(path: str | None) -> str | None:
    return Path(path).expanduser().read_text().strip() if path else None


async def _amain(ns: argparse.Namespace) -> None:
    snapshot = load_snapshot_file(ns.snapshot) if ns.snapshot else None
    listen = ns.listen or (snapshot.router.listen if snapshot else "127.0.0.1:8080")
    metrics_listen = ns.metrics_listen or (snapshot.router.metrics_listen if snapshot else "127.0.0.1:9091")
    async with contextlib.AsyncExitStack() as stack:
        keys: KeyStore | None = None
        clock = limits_clock(ns.limits_clock_offset)
        limiter: Limiter = memory_limiter(clock)
        usage: UsageSink | None = None
        writer: Any = None  # the store's UsageWriter, when there is a store
        if ns.store:
            from llmgw.store.limiter import Limiter as PoolLimiter
            from llmgw.store.store import Store
            from llmgw.store.usage_writer import UsageWriter

            store = await Store.open(ns.store)
            stack.push_async_callback(store.close)
            keys = StoreKeys(store)
            limiter = TenantLimiter(PoolLimiter(store, clock=clock))
            writer = UsageWriter(store)
            await writer.start()
            stack.push_async_callback(writer.close)
            usage = writer
        elif ns.keys_file:
            keys = StaticKeys.from_file(ns.keys_file)
        elif not ns.no_auth:
            raise SystemExit(
                "llmgw-router: give --store DSN or --keys-file FILE, or --no-auth to serve without keys"
            )
        if keys is None:
            log.warning(
                "AUTHENTICATION IS DISABLED (--no-auth): anyone who reaches %s can use every model", listen
            )
        options = RouterOptions(
            router_id=ns.router_id,
            on_demand_wait=ns.on_demand_wait,
            debug_token=_read_secret(ns.debug_token_file),
            write_timeout=ns.write_timeout,
            request_deadline=ns.request_deadline,
        )
        link: ControllerLink | None = None
        router = Router(options, Authenticator(keys), limiter, usage)
        if writer is not None:
            router.metrics.usage_pending.set_function(lambda: writer.stats.pending if writer else 0)
        if ns.controller:
            link = ControllerLink(
                [controller_url(a) for a in ns.controller],
                ns.router_id,
                _read_secret(ns.token_file),
                router.apply_snapshot,
                lambda: dict(router.last_used),
                lambda up: router.metrics.controller_connected.set(1 if up else 0),
            )
            router.controller = link
        elif snapshot is not None:
            router.apply_snapshot(snapshot)
        listeners = await serve(router, listen, metrics_listen, link)
        stack.push_async_callback(listeners.close)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"llmgw-router listening on {listen} (api port {listeners.api_port}, metrics port {listeners.metrics_port})",
            flush=True,
        )
        await stop.wait()


def run(ns: argparse.Namespace) -> None:
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:
        runner = asyncio.run
    try:
        runner(_amain(ns))
    except ValueError as exc:
        print(f"llmgw-router: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def main(argv: Sequence[str] | None = None) -> None:
    run(build_parser().parse_args(argv))
