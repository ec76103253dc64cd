"""The agent daemon: connect out to a controller, register, heartbeat, run commands, report shard changes.

Controller addresses are tried in turn with jittered exponential backoff; a standby answers Refused and the agent
moves on to the next address. Engines keep running while the agent is disconnected or restarting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import re
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import ValidationError

from llmgw_agent import __version__, config, doctor, health, inventory, redact
from llmgw_agent.engines import EXECUTABLES, SpecError
from llmgw_agent.exporter import Exporter
from llmgw_agent.installs import EngineRegistry
from llmgw_agent.logring import LogPage, LogRing, RingHandler
from llmgw_agent.mirror_auth import hub_token_may_go
from llmgw_agent.protocol import (
    Command,
    Heartbeat,
    Inventory,
    LogQuery,
    Refused,
    Register,
    Reply,
    ShardStatus,
    ShardUpdate,
    Welcome,
    dump,
    parse_controller_message,
)
from llmgw_agent.supervisor import Supervisor, SupervisorConfig
from llmgw_agent.thermals import ThermalSampler

log = logging.getLogger("llmgw_agent")
INVENTORY_EVERY = 12  # heartbeats between inventory refreshes


class RefusedError(Exception):
    pass


def ssl_context(cfg: config.AgentConfig) -> ssl.SSLContext | None:
    if cfg.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.tls.ca)
    ctx.load_cert_chain(cfg.tls.cert, cfg.tls.key)
    return ctx


def next_backoff(current: float, maximum: float) -> float:
    return min(current * 2, maximum)


def jittered(delay: float, rng: random.Random) -> float:
    # Spread reconnects so a restarted controller is not hit by every agent in the same instant.
    return delay * rng.uniform(0.5, 1.5)


class Agent:
    def __init__(self, cfg: config.AgentConfig) -> None:
        self.cfg = cfg
        self.updates: asyncio.Queue[ShardStatus] = asyncio.Queue()
        self.ring = LogRing(cfg.log_ring_lines, cfg.log_ring_bytes)
        self.supervisor = Supervisor(
            SupervisorConfig(
                state_dir=Path(cfg.state_dir),
                advertise_host=cfg.advertise_host,
                bind_host=cfg.bind_host,
                port_range=cfg.port_range,
                engine_binaries={k: v.path for k, v in cfg.engines.items() if v.path},
                weights_dir=Path(cfg.weights_dir) if cfg.weights_dir else None,
                max_download_bytes=cfg.max_download_bytes,
                fetch_parallelism=cfg.fetch_parallelism,
                mirror_headers=self._mirror_headers,
                ready_timeout_s=cfg.ready_timeout_s,
                stop_grace_s=cfg.stop_grace_s,
            ),
            self.updates.put_nowait,
            self.ring,
        )
        self.inventory: Inventory | None = None
        self.connected = asyncio.Event()
        self._rng = random.Random()
        # Set when what the inventory says changed (an engine installed, weights fetched or collected): the
        # next heartbeat carries a fresh inventory instead of waiting for the periodic one.
        self.inventory_changed = asyncio.Event()
        self.engines = EngineRegistry(
            root=Path(cfg.state_dir) / "engines",
            configured={k: (v.path, v.version) for k, v in cfg.engines.items()},
            on_change=self._engines_changed,
        )
        self.supervisor.weights_index.on_change = self.inventory_changed.set
        self._installs: set[asyncio.Task[None]] = set()
        self.thermals = ThermalSampler()
        self.exporter = Exporter(
            version=__version__,
            node=cfg.node,
            paths=self.used_paths,
            engine_exits=lambda: dict(self.supervisor.engine_exits),
            thermals=self.thermals,
        )
        self.metrics_address: str | None = None

    def used_paths(self) -> list[tuple[str, str]]:
        """(role, path) of every directory the agent writes or reads weights in: what its disk series cover."""
        return [
            ("weights", str(self.supervisor.cache_dir)),
            ("state", self.cfg.state_dir),
            *(("models", d) for d in self.cfg.model_dirs),
        ]

    async def start_exporter(self) -> None:
        if self.cfg.metrics_listen is None:
            return
        try:
            host, port = await self.exporter.start(self.cfg.metrics_listen)
        except OSError as exc:  # a port taken is a configuration error: say so and stop, not run half-seen
            raise SystemExit(f"llmgw-agent: metrics_listen {self.cfg.metrics_listen}: {exc}") from exc
        # A wildcard bind is reached at the address routers use for this node's engines.
        shown = self.cfg.advertise_host if host in ("0.0.0.0", "::", "") else host
        self.metrics_address = f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"
        log.info("node-health metrics on %s", self.metrics_address)

    def _engines_changed(self) -> None:
        configured = {k: v.path for k, v in self.cfg.engines.items() if v.path}
        self.supervisor.cfg.engine_binaries = {**configured, **self.engines.binaries()}
        self.inventory_changed.set()

    async def collect_inventory(self) -> Inventory:
        self.inventory_changed.clear()
        weights = self.supervisor.weights_index.report
        cache = str(self.supervisor.cache_dir)
        conditions = list(self.engines.conditions.values())
        engines = None if self.engines.reported is None else dict(self.engines.reported)

        def measure() -> Inventory:
            return inventory.collect(
                self.cfg.model_dirs,
                engines,
                self.cfg.labels,
                self.cfg.inventory_override,
                cache_dir=cache,
                weights=weights(),
                conditions=conditions,
            )

        return await asyncio.to_thread(measure)

    def _ring_handler(self) -> RingHandler:
        """The agent's own log lines into the ring, its node token hidden as well as the patterns."""
        token: list[str | None] = []
        if self.cfg.token_file:
            with contextlib.suppress(OSError):
                token.append(Path(self.cfg.token_file).read_text().strip())
        return RingHandler(self.ring, redact.redactor(redact.secret_values(extra=token)))

    async def run(self) -> None:
        handler = self._ring_handler()
        logging.getLogger("llmgw_agent").addHandler(handler)
        try:
            await self._run()
        finally:
            logging.getLogger("llmgw_agent").removeHandler(handler)

    async def _run(self) -> None:
        adopted = self.supervisor.adopt()
        for status in adopted:
            log.info("re-adopted shard %s (pid %s)", status.shard_id, status.pid)
        # Probed before the first register: registering with no engine list beats one that reports an engine
        # that cannot run, and the probe is bounded (a timeout per engine).
        await self.engines.probe_configured()
        self.inventory = await self.collect_inventory()
        await self.start_exporter()
        urls = self.cfg.controller_urls()
        backoff, index = 0.5, 0
        try:
            while True:
                url = urls[index % len(urls)]
                try:
                    await self.session(url)
                    backoff = 0.5  # it was up: come back quickly
                except RefusedError as exc:
                    log.info("controller %s refused: %s", url, exc)
                except (TimeoutError, aiohttp.ClientError, OSError, ValidationError) as exc:
                    log.warning("controller %s: %s", url, exc or type(exc).__name__)
                self.connected.clear()
                index += 1
                if len(urls) > 1 and index % len(urls):
                    # The next address has not been tried this round: the delay exists to stop hammering one
                    # controller, and after a failover the new leader should not wait out a grown backoff.
                    await asyncio.sleep(0.05)
                    continue
                await asyncio.sleep(jittered(backoff, self._rng))
                backoff = next_backoff(backoff, self.cfg.max_backoff_s)
        finally:
            for task in list(self._installs):
                task.cancel()
            await self.exporter.close()
            await self.supervisor.close()

    def _headers(self) -> dict[str, str]:
        if not self.cfg.token_file:
            return {}
        token = Path(self.cfg.token_file).read_text().strip()  # re-read each time: tokens rotate
        return {"Authorization": f"Bearer {token}"}

    def _mirror_headers(self, url: str) -> dict[str, str]:
        """The hub token for the controller's own mirror; nothing for a mirror elsewhere (mirror_auth, M14)."""
        if not hub_token_may_go(url, self.cfg.controller_urls()):
            return {}
        return self._headers()

    async def session(self, url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            http.ws_connect(
                url, headers=self._headers(), ssl=ssl_context(self.cfg) or True, heartbeat=30
            ) as ws,
        ):
            assert self.inventory is not None
            while not self.updates.empty():  # Register carries the current state of every shard
                self.updates.get_nowait()
            register = Register(
                node=self.cfg.node,
                agent_version=__version__,
                inventory=self.inventory,
                shards=self.supervisor.statuses(),
                metrics_address=self.metrics_address,
                sent_at=time.time(),
            )
            await ws.send_str(dump(register))
            first = await asyncio.wait_for(ws.receive(), timeout=30)
            if first.type != aiohttp.WSMsgType.TEXT:
                raise aiohttp.ClientError(f"connection closed before welcome ({first.type.name})")
            msg = parse_controller_message(first.data)
            if isinstance(msg, Refused):
                raise RefusedError(msg.reason)
            if not isinstance(msg, Welcome):
                raise aiohttp.ClientError(f"expected welcome, got {msg.type}")
            log.info("registered with %s as %s", url, self.cfg.node)
            self.connected.set()
            await self._serve(ws, msg.heartbeat_interval_s)

    async def _serve(self, ws: aiohttp.ClientWebSocketResponse, interval: float) -> None:
        lock = asyncio.Lock()

        async def send(text: str) -> None:
            async with lock:
                await ws.send_str(text)

        tasks = [
            asyncio.create_task(self._heartbeats(send, interval)),
            asyncio.create_task(self._forward_updates(send)),
        ]
        commands: set[asyncio.Task[None]] = set()
        try:
            async for raw in ws:
                if raw.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    msg = parse_controller_message(raw.data)
                except ValidationError as exc:
                    log.warning("ignoring a message the agent cannot read: %s", exc.errors()[:1])
                    continue
                if isinstance(msg, Command):
                    task = asyncio.create_task(self._command(send, msg))
                    commands.add(task)
                    task.add_done_callback(commands.discard)
                elif isinstance(msg, Refused):
                    raise RefusedError(msg.reason)
        finally:
            for t in tasks:
                t.cancel()
            # gather, not each awaited under suppress(CancelledError): a stop (SIGTERM cancels this task) that
            # lands while they end must go on, or the agent would keep running with its supervisor waiting.
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _heartbeats(self, send: Any, interval: float) -> None:
        beats = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.inventory_changed.wait(), interval)
            beats += 1
            inv = None
            if beats % INVENTORY_EVERY == 0 or self.inventory_changed.is_set():
                inv = self.inventory = await self.collect_inventory()
            thermals = await asyncio.to_thread(self.thermals.sample)  # measured at most every 10 s
            beat = Heartbeat(
                shards=self.supervisor.statuses(), inventory=inv, thermals=thermals, sent_at=time.time()
            )
            await send(dump(beat))

    async def _forward_updates(self, send: Any) -> None:
        while True:
            status = await self.updates.get()
            await send(dump(ShardUpdate(shard=status)))

    async def _command(self, send: Any, cmd: Command) -> None:
        try:
            payload = await self.execute(cmd)
            reply = Reply(id=cmd.id, ok=True, payload=payload)
        except (SpecError, RuntimeError, ValueError, OSError) as exc:
            reply = Reply(id=cmd.id, ok=False, error=str(exc))
        except Exception as exc:  # a bug must not take the connection down; say what happened
            log.exception("command %s failed", cmd.action)
            reply = Reply(id=cmd.id, ok=False, error=f"internal error: {type(exc).__name__}")
        with contextlib.suppress(ConnectionError, RuntimeError):
            await send(dump(reply))

    async def execute(self, cmd: Command) -> dict[str, Any]:
        if cmd.action == "start_shard":
            if cmd.spec is None:
                raise ValueError("start_shard needs a spec")
            return {"shard": self.supervisor.start(cmd.spec).model_dump(mode="json")}
        if cmd.action == "stop_shard":
            replica = cmd.replica_id or (cmd.spec.replica_id if cmd.spec else None)
            if not replica:
                raise ValueError("stop_shard needs replica_id")
            stopped = await self.supervisor.stop(replica, cmd.shard_rank)
            return {"shards": [s.model_dump(mode="json") for s in stopped]}
        if cmd.action == "list_shards":
            return {"shards": [s.model_dump(mode="json") for s in self.supervisor.statuses()]}
        if cmd.action == "engine_check":
            return await self.engine_check(cmd.engine or (cmd.spec.engine if cmd.spec else None))
        if cmd.action == "collect_weights":
            result = self.supervisor.weights_index.collect(cmd.keep, cmd.dry_run)
            self.inventory_changed.set()
            return result
        if cmd.action == "logs":
            return await self.read_logs(cmd.logs or LogQuery())
        if cmd.action == "install_engines":
            # Installs take minutes: the reply says the orders were taken; progress and failures are node
            # conditions in the inventory, which is sent again as each engine finishes.
            task = asyncio.create_task(self.engines.converge(cmd.engines), name="install-engines")
            self._installs.add(task)
            task.add_done_callback(self._installs.discard)
            return {"accepted": [o.engine for o in cmd.engines]}
        if cmd.action == "doctor":
            return await self.doctor(cmd.controller_time)
        raise ValueError(f"unknown action {cmd.action}")

    async def doctor(self, controller_time: float | None) -> dict[str, Any]:
        """The node checks itself (llmgw_agent.doctor): driver, engines, disk, clock, controllers, certificate."""
        received = time.time()
        smi, filesystems = await asyncio.gather(
            asyncio.to_thread(health.run_gpu_query), asyncio.to_thread(health.filesystems, self.used_paths())
        )
        engines = sorted(self.engines.reported or {})
        conditions = [
            f"{c.engine}: {c.message}"
            for c in self.engines.conditions.values()
            if c.type != "EngineInstalling"
        ]
        checks = [
            *doctor.check_driver(smi),
            doctor.check_cpu(
                self.inventory.arch if self.inventory else None,
                self.inventory.cpu_flags if self.inventory else None,
            ),
            *await doctor.check_engines(engines, self.engine_check, conditions),
            *doctor.check_disk(filesystems, str(self.supervisor.cache_dir), self.cfg.doctor_min_free_bytes),
            doctor.check_clock(received, controller_time),
            *await doctor.check_controllers(self.cfg.controller_urls()),
            doctor.check_certificate(self.cfg.tls.cert if self.cfg.tls else None, time.time()),
        ]
        return {"node": self.cfg.node, "agent_version": __version__, "checks": [c.as_json() for c in checks]}

    async def read_logs(self, q: LogQuery) -> dict[str, Any]:
        """A page of the log ring; with `wait_s` and a cursor, waits that long for a first matching line."""
        try:
            pattern = re.compile(q.grep) if q.grep else None
        except re.error as exc:
            raise ValueError(f"grep {q.grep!r} is not a regular expression: {exc}") from None
        # A cursor from another agent process: every line this one holds is new to the reader.
        after = q.after if q.after is None or q.boot == self.ring.boot else 0

        def page(from_seq: int | None) -> LogPage:
            return self.ring.query(
                after=from_seq, since=q.since, grep=pattern, source=q.source, shard=q.shard, limit=q.limit
            )

        found = page(after)
        missed = found.missed
        deadline = time.monotonic() + q.wait_s
        while after is not None and not found.lines and (left := deadline - time.monotonic()) > 0:
            if not await self.ring.wait_past(found.next_after, left):
                break
            found = page(found.next_after)
        return {
            "boot": self.ring.boot,
            "lines": [line.json() for line in found.lines],
            "next_after": found.next_after,
            "more": found.more,
            "missed": missed,
            "first_seq": self.ring.first_seq,
            "ring": {"max_lines": self.ring.max_lines, "max_bytes": self.ring.max_bytes},
        }

    async def engine_check(self, engine: str | None) -> dict[str, Any]:
        """Run the engine's `--version`: only on request, by someone who meant to run the engine."""
        if engine is None:
            raise ValueError("engine_check needs an engine")
        if engine == "sim":
            return {"engine": "sim", "ok": True, "version": __version__}
        conf = self.cfg.engines.get(engine)
        path = self.engines.binaries().get(engine) or (conf.path if conf and conf.path else None)
        if path is None:
            import shutil

            path = next((p for n in EXECUTABLES.get(engine, ()) if (p := shutil.which(n))), None)
        if path is None:
            return {"engine": engine, "ok": False, "output": "not installed (not configured, not on PATH)"}
        # SGLang is a module, not a binary: ask the configured python to import it and say its version.
        sglang = [path, "-c", "import sglang; print(sglang.__version__)"]
        argv = sglang if engine == "sglang" else [path, "--version"]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return {"engine": engine, "ok": False, "output": "--version did not finish in 30s"}
        text = out.decode("utf-8", "replace")[-4000:]
        return {"engine": engine, "ok": proc.returncode == 0, "path": path, "output": text}


def add_arguments(p: argparse.ArgumentParser) -> None:
    config.add_arguments(p)


async def _main(cfg: config.AgentConfig) -> None:
    agent = Agent(cfg)
    task = asyncio.create_task(agent.run())
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Leave engines running: the next agent re-adopts them.
        loop.add_signal_handler(sig, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run_from_args(ns: argparse.Namespace) -> None:
    logging.basicConfig(level=ns.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = config.load(ns)
    asyncio.run(_main(cfg))
