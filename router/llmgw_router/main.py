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
import resource
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from llmgw.adapters import logformat
from llmgw.adapters.tracing import ENDPOINT_ENV, configured_endpoint
from llmgw.core.config.secretrefs import DEFAULT_ENV_PREFIX, SecretPolicy
from llmgw.core.snapshot import RouterSnapshot
from llmgw_router import heap, workers
from llmgw_router.app import build_router, serve
from llmgw_router.options import RouterOptions
from llmgw_router.path.auth import KeyStore, StaticKeys
from llmgw_router.path.service import RequestService

__all__ = ["build_parser", "load_snapshot_file", "main", "parse_args", "run"]

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
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML mapping of these settings, named as the flags (`tls_cert: /etc/...`; flags win)",
    )
    # One of the two is required: checked after the --config file's settings are in (parse_args).
    source = p.add_mutually_exclusive_group()
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
    _add_trust_flags(p)
    _add_request_flags(p)
    _add_drain_flags(p)
    _add_state_flags(p)
    p.add_argument("--log-level", default="INFO")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one JSON object per log line (time, level, logger, message, request_id where known)",
    )
    return p


def _add_trust_flags(p: argparse.ArgumentParser) -> None:
    """Who may call this router, and how it proves itself to the controller."""
    p.add_argument("--store", metavar="DSN", help="store DSN: keys, pooled limits and usage")
    p.add_argument("--keys-file", metavar="FILE", help="with no store: lines of `SHA256HEX PROJECT [KEY_ID]`")
    p.add_argument("--no-auth", action="store_true", help="serve without API keys (development only)")
    p.add_argument(
        "--token-file", metavar="FILE", help="the router token presented to the controller (never a node's)"
    )
    p.add_argument("--controller-ca", metavar="FILE", help="CA certificate the controller's must chain to")
    p.add_argument(
        "--controller-cert",
        metavar="FILE",
        help="this router's client certificate (router:NAME, `llmgw node router-cert`), asked for with a CA",
    )
    p.add_argument("--controller-key", metavar="FILE", help="the key of --controller-cert")
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve the API over TLS with this certificate (PEM, chain after the leaf); ALPN http/1.1",
    )
    p.add_argument("--tls-key", metavar="FILE", help="the key of --tls-cert")


def _add_drain_flags(p: argparse.ArgumentParser) -> None:
    """How a router stops on SIGTERM behind a load balancer (`_drain`)."""
    p.add_argument(
        "--drain-delay",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="on SIGTERM, /ready answers 503 draining this long while requests are still served, so a load "
        "balancer's health check sends new ones elsewhere first (its check interval x fall count)",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="after the drain delay, requests in flight get this long to finish before they are cut off",
    )


def _add_request_flags(p: argparse.ArgumentParser) -> None:
    """How requests are served: debugging, naming, on-demand waits, timeouts."""
    p.add_argument(
        "--debug-token-file", metavar="FILE", help="requests sending this in x-llmgw-debug get the decision"
    )
    p.add_argument(
        "--operator-token-file",
        metavar="FILE",
        help="the token (Authorization: Bearer) that reads GET /requests/ID on the metrics listener and the "
        "revision and guardrails in /ready (`llmgw request ID --router URL --router-token-file FILE`); "
        "unset: /requests/ID is refused and /ready says only ready or not",
    )
    p.add_argument(
        "--router-id", default=socket.gethostname(), help="name of this router in usage and reports"
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="router processes sharing the API port (SO_REUSEPORT), metrics summed on --metrics-listen; "
        "above 1 needs --store (default: the snapshot's router.workers, else 1)",
    )
    p.add_argument(
        "--on-demand-wait",
        type=float,
        default=None,
        help="seconds a request waits for a model with no replica yet (default: 1.5 x its measured load time "
        "+ 5, else the snapshot's router.admission.load_timeout)",
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
        "--key-cache-ttl",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds a key looked up in the store is trusted: a revoked key works at most this long after",
    )


def _add_state_flags(p: argparse.ArgumentParser) -> None:
    """The router's own files (spool, grace ledger, secrets) and the testing-only clock offset."""
    p.add_argument(
        "--state-dir",
        default=".llmgw/router",
        help="the router's own files: the usage spool, the outage grace ledger, the default secrets directory",
    )
    p.add_argument(
        "--secrets-dir",
        help="the repo's provider keys {file: NAME} are read here, NAME relative to it (default STATE_DIR/secrets)",
    )
    p.add_argument(
        "--secret-env-prefix",
        default=DEFAULT_ENV_PREFIX,
        help="the repo's provider keys {env: NAME} must name a variable with this prefix",
    )
    p.add_argument(
        "--usage-spool",
        metavar="DIR",
        help="with --store: usage records are appended here before they are batched to the store, and what "
        "a killed router left is written at start (default STATE_DIR/usage-spool/ROUTER_ID; one router each)",
    )
    p.add_argument(
        "--content-key-file",
        metavar="FILE",
        help="with --store: the content key (32 bytes, base64) stored responses are sealed with, for projects "
        "that opt in to content retention; the controller's content_key_file (docs/traffic.md)",
    )
    p.add_argument(
        "--usage-flush-interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="usage is batched to the store at least this often (and fsynced in the spool before each batch)",
    )
    p.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help=f"send OpenTelemetry spans of every request to this OTLP/HTTP collector (http://HOST:4318; "
        f"default ${ENDPOINT_ENV}); needs the llmgw[tracing] extra. Unset: no tracing, nothing loaded",
    )
    p.add_argument(
        "--trace-sample",
        type=float,
        default=1.0,
        metavar="RATIO",
        help="with --otlp-endpoint: the share of requests traced, decided at the root (a client's sampled flag is ignored)",
    )
    p.add_argument(
        "--limits-clock-offset",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="testing only: the rate-limit windows' clock runs SECONDS ahead of this machine's (tests start "
        "at a window's start instead of sleeping until one comes); never set it in production",
    )


def controller_tls(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The context for the controller stream: the cluster CA and this router's certificate; None for the
    system defaults (no flags)."""
    if ca is None and cert is None:
        return None
    if (cert is None) != (key is None):
        raise ValueError("--controller-cert and --controller-key go together")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert is not None and key is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def api_tls(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The API listener's server context (TLS 1.2 or newer, ALPN http/1.1: the listener speaks HTTP/1.1 only);
    None without --tls-cert. A file that cannot be read stops the router, naming it (ValueError)."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("--tls-cert and --tls-key go together")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_alpn_protocols(["http/1.1"])
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"--tls-cert {cert} / --tls-key {key}: {exc.strerror or exc}") from None
    return ctx


def grace_ledger_path(ns: argparse.Namespace) -> Path:
    """The outage grace shares this router id took (docs/tenancy.md): kept across its restarts. A worker
    of several is told its own file (a ledger has one writer)."""
    if getattr(ns, "grace_file", None):
        return Path(ns.grace_file)
    return (Path(ns.state_dir) / "grace" / f"{ns.router_id}.jsonl").absolute()


def usage_spool_dir(ns: argparse.Namespace) -> Path:
    """This router's usage spool: one per router id, so routers sharing a state dir never share a spool."""
    return Path(ns.usage_spool or Path(ns.state_dir) / "usage-spool" / ns.router_id).absolute()


def secret_policy(ns: argparse.Namespace) -> SecretPolicy:
    """Where this router reads provider keys from: its flags, never the repo (made absolute at start)."""
    base = Path(ns.secrets_dir) if ns.secrets_dir else Path(ns.state_dir) / "secrets"
    return SecretPolicy(base, ns.secret_env_prefix).absolute()


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


def _operator_token(path: str | None) -> str | None:
    token = _read_secret(path)
    if token == "":  # an empty token would refuse everyone while looking configured
        raise ValueError(f"--operator-token-file {path} is empty: it should hold the token on one line")
    return token


def content_key(path: str | None) -> bytes | None:
    """The content key, read once at start: a bad file stops the router, naming it (ValueError)."""
    if path is None:
        return None
    from llmgw.store.queries.content import ContentError, parse_content_key

    where = f"--content-key-file {path}"
    try:
        return parse_content_key(Path(path).expanduser().read_text(encoding="utf-8"), where)
    except OSError as exc:
        raise ValueError(f"{where}: {exc.strerror}") from None
    except ContentError as exc:
        raise ValueError(str(exc)) from None


def _keys(ns: argparse.Namespace, listen: str) -> KeyStore | None:
    """The keys file's keys without a store (the store's are read from it); None: --no-auth, said loudly."""
    keys: KeyStore | None = None
    if ns.store is None and ns.keys_file:
        keys = StaticKeys.from_file(ns.keys_file)
    elif ns.store is None and not ns.no_auth:
        raise SystemExit(
            "llmgw-router: give --store DSN or --keys-file FILE, or --no-auth to serve without keys"
        )
    if ns.store is None and keys is None:
        log.warning(
            "AUTHENTICATION IS DISABLED (--no-auth): anyone who reaches %s can use every model", listen
        )
    return keys


def _options(ns: argparse.Namespace) -> RouterOptions:
    """What the request path is told from the command line (and --config)."""
    return RouterOptions(
        router_id=ns.router_id,
        on_demand_wait=ns.on_demand_wait,
        debug_token=_read_secret(ns.debug_token_file),
        operator_token=_operator_token(ns.operator_token_file),
        write_timeout=ns.write_timeout,
        request_deadline=ns.request_deadline,
        key_cache_ttl=ns.key_cache_ttl,
        secrets=secret_policy(ns),
        otlp_endpoint=configured_endpoint(ns.otlp_endpoint),
        trace_sample=ns.trace_sample,
    )


async def _amain(ns: argparse.Namespace, seat: workers.WorkerSeat | None = None) -> None:
    snapshot = load_snapshot_file(ns.snapshot) if ns.snapshot else None
    listen = ns.listen or (snapshot.router.listen if snapshot else "127.0.0.1:8080")
    metrics_listen = ns.metrics_listen or (snapshot.router.metrics_listen if snapshot else "127.0.0.1:9091")
    keys = _keys(ns, listen)
    tls = api_tls(ns.tls_cert, ns.tls_key)
    options = _options(ns)
    async with contextlib.AsyncExitStack() as stack:
        built = await build_router(
            stack,
            options,
            store=ns.store or None,
            keys=keys,
            controllers=ns.controller or (),
            token=_read_secret(ns.token_file),
            ssl_context=controller_tls(ns.controller_ca, ns.controller_cert, ns.controller_key)
            if ns.controller
            else None,
            limits_clock=limits_clock(ns.limits_clock_offset),
            usage_spool=usage_spool_dir(ns),
            usage_flush_interval=ns.usage_flush_interval,
            grace_ledger=grace_ledger_path(ns),
            content_key=content_key(ns.content_key_file),
        )
        if built.link is None and snapshot is not None:
            built.service.apply_snapshot(snapshot)
        given: dict[str, Any] = seat.sockets() if seat is not None else {}
        # What start-up built lives as long as the process: out of the GC's walk, before any request waits.
        heap.settle_after_start()
        listeners = await serve(
            built.service,
            listen,
            metrics_listen,
            built.link,
            drain_timeout=ns.drain_timeout,
            tls=tls,
            **given,
        )
        stack.push_async_callback(listeners.close)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if seat is not None:  # one of several workers: the parent says where the router listens
            seat.report(listeners.metrics_port)
        else:
            print(
                f"llmgw-router listening on {listen}{' (TLS)' if tls else ''} (api port {listeners.api_port}, metrics port {listeners.metrics_port})",
                flush=True,
            )
        await stop.wait()
        await _drain(built.service, ns.drain_delay)


async def _drain(service: RequestService, delay: float) -> None:
    """Say not-ready while still serving for `delay` seconds: a load balancer's health check takes this router
    out before it stops listening, so no new request meets a closed port. Then the listeners close, and the
    requests in flight get --drain-timeout to finish (Listeners.close); the usage writer flushes after them."""
    service.draining = True
    log.info("draining: /ready says so for %.1fs, then the listeners close", delay)
    if delay > 0:
        await asyncio.sleep(delay)


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit (a systemd service starts at 1024):
    connections held by clients must not leave none for engines, the store or accepting (H6). The limit
    now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:  # e.g. an unlimited hard limit the kernel caps lower
            log.warning("cannot raise the open-files limit from %d to %d: %s", soft, hard, exc)
    return soft


def run(ns: argparse.Namespace, seat: workers.WorkerSeat | None = None) -> None:
    logformat.configure(ns.log_level, ns.log_format)
    log.debug("open-files limit: %d", raise_descriptor_limit())
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # a platform without uvloop's wheels: correct, only dearer per request
        log.warning("uvloop is not installed: the router runs on asyncio's default event loop")
        runner = asyncio.run
    try:
        if seat is None and _supervise_workers(ns):
            return
        runner(_amain(ns, seat))
    except ValueError as exc:
        print(f"llmgw-router: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def _supervise_workers(ns: argparse.Namespace) -> bool:
    """With more than one worker, run them (llmgw_router.workers) and return True when they stopped."""
    snapshot = load_snapshot_file(ns.snapshot) if ns.snapshot else None
    count = workers.worker_count(ns, snapshot.router.workers if snapshot else None)
    if count == 1:
        return False
    listen = ns.listen or (snapshot.router.listen if snapshot else "127.0.0.1:8080")
    metrics_listen = ns.metrics_listen or (snapshot.router.metrics_listen if snapshot else "127.0.0.1:9091")
    workers.run_supervisor(ns, count, listen, metrics_listen)
    return True


def config_defaults(path: Path, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The --config file's settings as the parser's defaults; ValueError naming the file and the key when
    one is not a flag of the router."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        raw: Any = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"--config {path}: {exc.strerror}") from None
    except YAMLError as exc:
        raise ValueError(f"--config {path}: not YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"--config {path}: expected a mapping of settings (listen: 0.0.0.0:8443, ...)")
    known = {a.dest for a in parser._actions} - {"help", "config"}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        dest = str(key).replace("-", "_")
        if dest not in known:
            raise ValueError(
                f"--config {path}: {key!r} is not a router setting (one of: {', '.join(sorted(known))})"
            )
        values[dest] = [value] if dest == "controller" and isinstance(value, str) else value
    return values


def parse_args(args: Sequence[str]) -> argparse.Namespace:
    """The flags over the --config file's settings."""
    parser = build_parser()
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config")
    given, _ = pre.parse_known_args(args)
    if given.config:
        try:
            parser.set_defaults(**config_defaults(Path(given.config), parser))
        except ValueError as exc:
            parser.error(str(exc))
    ns = parser.parse_args(args)
    if not ns.controller and not ns.snapshot:
        parser.error(
            "one of --controller ADDR and --snapshot FILE is required (or `controller:` in --config)"
        )
    if ns.controller and ns.snapshot:
        parser.error("--controller and --snapshot are exclusive (one may come from --config)")
    return ns


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [workers.WORKER_FLAG]:  # one of several workers, started by the supervisor (workers.py)
        if len(args) != 2:
            raise SystemExit(f"llmgw-router: {workers.WORKER_FLAG} takes one argument, the supervisor's spec")
        ns, seat = workers.take_seat(args[1])
        run(ns, seat=seat)
        return
    run(parse_args(args))
