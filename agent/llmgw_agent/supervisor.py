"""Engine supervision: start, wait ready, watch, stop, and re-adopt after an agent restart.

Each engine runs in its own session (so its own process group), with its output appended to a log file in the
shard's work directory rather than a pipe: an engine must survive the agent's exit, and a pipe whose reader died
would kill it with SIGPIPE. The last lines are read back from that file. Each running shard is persisted as JSON in
the state dir; a restarted agent re-adopts an engine only when its pid is alive and /proc/PID/stat shows the same
start time, so a recycled pid is never mistaken for the engine (and never signalled).

What the engines print also goes into the agent's log ring (llmgw_agent.logring), redacted: one task follows
every running shard's output file, and measures each engine's memory (llmgw_agent.engine_memory) now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from llmgw_agent import compute, dirfetch, engine_memory, engines, redact, repo_rules, weights
from llmgw_agent.cache_index import INDEX_FILE, WeightsIndex
from llmgw_agent.engine_process import (
    OUTPUT_FILE,
    OUTPUT_LINES,
    describe_exit,
    engine_environment,
    group_alive,
    head_lines,
    proc_environ,
    proc_start_time,
    redact_argv,
)
from llmgw_agent.kv_relay import RELAY_PATH
from llmgw_agent.logring import LogRing, OutputTail
from llmgw_agent.passthrough import (
    DIGEST_ENV,
    ENGINE_HOST,
    KEY_ON_ARGV,
    fronted_argv,
    key_digest,
    needs_passthrough,
)
from llmgw_agent.protocol import ShardSpec, ShardStatus
from llmgw_agent.shards import Shard, file_tail, free_cpus, free_port, read_record, write_record
from llmgw_agent.supervisor_config import (
    SupervisorConfig as SupervisorConfig,  # daemon and `llmgw up` build it here
)

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self, cfg: SupervisorConfig, on_update: Callable[[ShardStatus], None], ring: LogRing | None = None
    ) -> None:
        self.cfg = cfg
        self.on_update = on_update
        self.ring = ring if ring is not None else LogRing()
        self.shards: dict[str, Shard] = {}
        # (model, engine) -> engine processes that exited on their own since the agent started (a counter).
        self.engine_exits: dict[tuple[str, str], int] = {}
        self._pump_task: asyncio.Task[None] | None = None
        (cfg.state_dir / "shards").mkdir(parents=True, exist_ok=True)
        (cfg.state_dir / "work").mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(OSError):  # made now so its filesystem is reported before the first fetch
            self._cache_dir().mkdir(parents=True, exist_ok=True)
        self.weights_index = WeightsIndex(cfg.state_dir / INDEX_FILE, self._cache_dir())

    # ---- queries ----

    def statuses(self) -> list[ShardStatus]:
        for shard in self.shards.values():
            self._refresh_output(shard)
        return [s.status.model_copy() for s in self.shards.values()]

    def _refresh_output(self, shard: Shard) -> None:
        if shard.status.state in ("starting", "ready", "failed", "stopping"):
            shard.status.last_output_lines = self._tail(shard)

    def _tail(self, shard: Shard) -> list[str]:
        """The shard's last lines from the ring; from its output file when the ring has none of them (an
        engine adopted after an agent restart: the ring starts at what it prints from then on)."""
        if shard.output is not None:
            shard.output.drain()
        lines = self.ring.tail(shard.spec.replica_id, shard.spec.shard_rank, OUTPUT_LINES)
        return lines or file_tail(shard)

    def _follow_output(self, shard: Shard, *, from_end: bool) -> None:
        path = shard.workdir / OUTPUT_FILE
        shard.output = OutputTail(
            self.ring, path, shard.spec.replica_id, shard.spec.shard_rank, shard.redact, from_end=from_end
        )
        if self._pump_task is None or self._pump_task.done():
            self._pump_task = asyncio.create_task(self._pump(), name="engine-output")

    def _stop_following(self, shard: Shard) -> None:
        if shard.output is not None:
            shard.output.drain(final=True)  # the last words of an engine that exited are the ones wanted
            shard.output = None
        shard.status.rss_bytes = shard.status.gpu_memory_bytes = None

    async def _pump(self) -> None:
        """Reads new engine output into the ring; measures engine memory every `memory_every_s`."""
        measured_at, measured = 0.0, set[int]()  # when, and which groups were measured then
        while True:
            try:
                for shard in list(self.shards.values()):
                    if shard.output is not None:
                        shard.output.drain()
                groups = {s.pgid for s in self.shards.values() if s.output is not None and s.pgid is not None}
                if groups - measured or time.monotonic() - measured_at >= self.cfg.memory_every_s:
                    measured_at, measured = time.monotonic(), groups
                    await self._measure_memory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the ring must not stop the supervisor; said each time, rare
                log.warning("reading engine output or memory failed: %s", exc)
            await asyncio.sleep(self.cfg.output_poll_s)

    async def _measure_memory(self) -> None:
        running = {s.pgid: s for s in self.shards.values() if s.output is not None and s.pgid is not None}
        if not running:
            return
        found = await asyncio.to_thread(engine_memory.measure, list(running), self.cfg.nvidia_smi)
        for pgid, shard in running.items():
            if shard.output is not None:  # still running after the measurement
                shard.status.rss_bytes, shard.status.gpu_memory_bytes = found.get(pgid, (None, None))

    def _set(self, shard: Shard, **changes: Any) -> None:
        for key, value in changes.items():
            setattr(shard.status, key, value)
        self.on_update(shard.status.model_copy())

    # ---- start ----

    def start(self, spec: ShardSpec) -> ShardStatus:
        """Begin starting a shard (fetch, launch, wait ready) in the background; returns its first status."""
        existing = self.shards.get(spec.shard_id)
        if existing and existing.status.state in ("fetching", "starting", "ready", "stopping"):
            if existing.spec.fingerprint == spec.fingerprint:
                return existing.status.model_copy()  # idempotent: the controller may repeat itself
            raise RuntimeError(
                f"shard {spec.shard_id} is {existing.status.state} with another profile; stop it first"
            )
        problem = repo_rules.replica_id_problem(spec.replica_id)
        if problem:  # it names files under the state dir: checked before any path is built from it
            raise engines.SpecError(problem)
        self.engine_exits.setdefault((spec.model, spec.engine), 0)  # a counter is seen at 0 before it moves
        ctx = self._context(spec, 0)
        engines.launch_plan(spec, ctx)  # refuse an impossible spec before anything runs
        engines.check_path_args(spec, Path(ctx.workdir), self._cache_dir())
        status = ShardStatus(
            replica_id=spec.replica_id,
            shard_rank=spec.shard_rank,
            model=spec.model,
            engine=spec.engine,
            state="fetching" if spec.source and (spec.source.url or spec.source.directory) else "starting",
            fingerprint=spec.fingerprint,
            gpus=list(spec.gpus),
            host=self.cfg.advertise_host,
        )
        shard = Shard(spec, status, self.cfg.state_dir / "work" / spec.shard_id)
        self.shards[spec.shard_id] = shard
        shard.task = asyncio.create_task(self._run(shard), name=f"shard-{spec.shard_id}")
        self.on_update(status.model_copy())
        return status.model_copy()

    @property
    def serving_host(self) -> str:
        return self.cfg.bind_host or self.cfg.advertise_host

    def _context(
        self, spec: ShardSpec, port: int, model_path: str | None = None, host: str = ENGINE_HOST
    ) -> engines.LaunchContext:
        workdir = str(self.cfg.state_dir / "work" / spec.shard_id)
        if model_path is None and spec.source:
            model_path = spec.source.path or "(fetched)"
        return engines.LaunchContext(
            host, port, model_path, workdir, self.cfg.engine_binaries.get(spec.engine)
        )

    async def _run(self, shard: Shard) -> None:
        try:
            model_path = weights.engine_model_path(shard.spec.engine, await self._fetch(shard))
            shard.adapter_paths = await self._fetch_adapters(shard)
            await self._launch(shard, model_path)
            await self._wait_ready(shard)
            if shard.proc is not None:
                await shard.proc.wait()
            else:
                await self._poll_exit(shard)
            self._exited(shard, shard.proc.returncode if shard.proc else None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # reported to the controller, never raised into the loop
            log.warning("shard %s failed: %s", shard.spec.shard_id, exc)
            self._stop_following(shard)
            self.weights_index.release(shard.spec.shard_id)
            self._set(shard, state="failed", message=str(exc))
            shard.exited.set()

    async def _fetch(self, shard: Shard) -> str | None:
        source = shard.spec.source
        if source is None:
            return None
        cache = self._cache_dir()

        def progress(done: int, total: int | None) -> None:
            shard.status.fetch_bytes_done, shard.status.fetch_bytes_total = done, total

        if source.url or source.directory:
            reporter = asyncio.create_task(self._report_progress(shard))
            try:
                if source.directory:
                    published = await dirfetch.fetch_directory(
                        source,
                        cache,
                        progress,
                        parallel=self.cfg.fetch_parallelism,
                        mirror_headers=self.cfg.mirror_headers,
                    )
                    self.weights_index.record_directory(
                        source.directory, published.digest, published.path, shard.spec.shard_id
                    )
                    return published.path
                path = await weights.resolve(source, cache, progress, max_bytes=self.cfg.max_download_bytes)
            finally:
                reporter.cancel()
        else:
            path = await weights.resolve(source, cache, progress)
        self.weights_index.record(source, path, shard.spec.shard_id)
        return path

    async def _fetch_adapters(self, shard: Shard) -> tuple[tuple[str, str], ...]:
        """Each LoRA adapter's files, the way weights come (a path checked, a URL or a directory fetched into
        the cache and its digest checked), recorded in the cache index so collection keeps them."""
        out = []
        cache = self._cache_dir()
        for adapter in shard.spec.adapters:
            source = adapter.source
            if source.directory:
                published = await dirfetch.fetch_directory(
                    source, cache, lambda done, total: None, mirror_headers=self.cfg.mirror_headers
                )
                assert source.directory is not None
                self.weights_index.record_directory(
                    source.directory, published.digest, published.path, shard.spec.shard_id
                )
                path = published.path
            else:
                path = await weights.resolve(
                    source, cache, lambda done, total: None, max_bytes=self.cfg.max_download_bytes
                )
                self.weights_index.record(source, path, shard.spec.shard_id)
            out.append((adapter.name, path))
        return tuple(out)

    def _cache_dir(self) -> Path:
        return self.cfg.weights_dir or (self.cfg.state_dir / "weights")

    @property
    def cache_dir(self) -> Path:
        return self._cache_dir()

    async def _report_progress(self, shard: Shard) -> None:
        last = -1
        while True:
            await asyncio.sleep(1.0)
            if shard.status.fetch_bytes_done != last:
                last = shard.status.fetch_bytes_done or 0
                self.on_update(shard.status.model_copy())

    def _pick_port(self, host: str, taken: frozenset[int] = frozenset()) -> int:
        return free_port(self.shards.values(), self.cfg.port_range, host, taken)

    def _pick_cpus(self, shard: Shard) -> tuple[int, ...]:
        return free_cpus(self.shards.values(), shard)

    def _kv_events(self, shard: Shard, fronted: bool) -> tuple[str, int] | None:
        """Where the engine's KV-event publisher binds: 127.0.0.1 only, on a port of its own (the events carry
        every prompt's token ids and the publisher has no authentication); routers read them through the
        pass-through's key check (kv_relay.py). None when not asked for, or the engine has no publisher or no
        pass-through to relay it."""
        spec = shard.spec
        if spec.kv_events is None or spec.engine not in engines.KV_EVENT_ENGINES or not fronted:
            return None
        taken = frozenset(p for p in (shard.status.port, shard.engine_port) if p is not None)
        shard.status.kv_events_port = self._pick_port(ENGINE_HOST, taken)
        shard.status.kv_events_path = RELAY_PATH
        return ENGINE_HOST, shard.status.kv_events_port

    def _launch_context(
        self, shard: Shard, model_path: str | None
    ) -> tuple[engines.LaunchContext, ShardSpec, bool, int]:
        """Where and how the engine runs: its context (address, port, cores, adapters, KV events), the spec it
        is launched with, whether a pass-through fronts it, and the serving port. Ports and cores are claimed
        here, before any await, so a concurrent start picks others."""
        spec = shard.spec
        serving = self.serving_host
        fronted = needs_passthrough(spec.engine, serving)
        port = self._pick_port(serving)
        shard.status.port = port
        if fronted:
            shard.engine_port = self._pick_port(ENGINE_HOST, frozenset({port}))
            # The pass-through is the key check for every path; an argv-only key would only leak through /proc.
            launch_spec = spec.model_copy(update={"api_key": None}) if spec.engine in KEY_ON_ARGV else spec
            ctx = self._context(launch_spec, shard.engine_port, model_path)
        else:
            launch_spec = spec
            ctx = self._context(spec, port, model_path, host=serving)
        if engines.pins_cpus(spec):
            shard.cpus = self._pick_cpus(shard)
        ctx = dataclasses.replace(
            ctx, adapters=shard.adapter_paths, kv_events=self._kv_events(shard, fronted), cpus=shard.cpus
        )
        return ctx, launch_spec, fronted, port

    async def _launch(self, shard: Shard, model_path: str | None) -> None:
        spec = shard.spec
        serving = self.serving_host
        ctx, launch_spec, fronted, port = self._launch_context(shard, model_path)
        plan = engines.launch_plan(launch_spec, ctx)
        argv, front_env = plan.argv, {}
        if fronted:
            # The pass-through runs in the engine's own process group, in front of it: it outlives the agent as
            # the engine does (a restarted or frozen agent does not stop traffic) and is stopped with it.
            events_port = ctx.kv_events[1] if ctx.kv_events is not None else None
            argv = fronted_argv(ctx.python, serving, port, ctx.port, plan.argv, events_port)
            front_env = {DIGEST_ENV: key_digest(spec.api_key)} if spec.api_key else {}
        shard.workdir.mkdir(parents=True, exist_ok=True)
        for name, content in plan.files.items():
            (shard.workdir / name).write_text(content)
        if plan.key_exposure != "environment" and launch_spec.api_key:
            log.warning(
                "shard %s: %s takes no key by environment (%s)", spec.shard_id, spec.engine, plan.key_exposure
            )
        engines.check_path_args(spec, shard.workdir, self._cache_dir())  # again: a symlink may have appeared
        env = engine_environment(spec, {**plan.env, **front_env})
        shard.redact = redact.redactor(redact.secret_values({**os.environ, **env}, extra=[spec.api_key]))
        log.info("starting shard %s: %s", spec.shard_id, " ".join(redact_argv(argv, spec.api_key)))
        with (shard.workdir / OUTPUT_FILE).open("wb") as out:
            shard.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=shard.workdir,
                start_new_session=True,
            )
        pid = shard.proc.pid
        shard.pgid = pid
        shard.start_ticks = proc_start_time(pid)
        self._follow_output(shard, from_end=False)
        shard.health_path = plan.health_path
        probe_host = ctx.host
        shard.status.host = self.cfg.advertise_host
        self._set(
            shard,
            state="starting",
            pid=pid,
            port=port,
            base_url=f"http://{self.cfg.advertise_host}:{port}",
            metrics_path=plan.metrics_path,
            started_at=time.time(),
            message="",
        )
        shard.probe_url = f"http://{probe_host}:{ctx.port}{plan.health_path}"
        self._persist(shard)

    async def _wait_ready(self, shard: Shard) -> None:
        url = shard.probe_url
        if url is None:
            raise RuntimeError("no readiness URL recorded for this shard")
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if shard.proc is not None and shard.proc.returncode is not None:
                    return  # _run reports the exit
                if shard.proc is None and not self._alive(shard):
                    return
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    async with session.get(url) as resp:
                        if resp.status == 200:
                            await self._check_compute(shard)
                            self._set(shard, state="ready", message="")
                            self._persist(shard)
                            return
                if time.monotonic() > deadline:
                    raise RuntimeError(await self._give_up(shard))
                await asyncio.sleep(self.cfg.poll_interval_s)

    async def _check_compute(self, shard: Shard) -> None:
        """Read what the engine said it computes on; a shard that wanted a GPU but runs on the CPU is stopped
        and failed in the engine's own words, not called ready."""
        if shard.output is not None:
            shard.output.drain()
        lines = head_lines(shard.workdir / OUTPUT_FILE)
        said = compute.read_compute(shard.spec.engine, lines)
        self._set(shard, compute=said.words())
        spec = shard.spec
        problem = compute.gpu_problem(said, compute.wants_gpu(spec.engine, spec.gpus, spec.args))
        if problem is None:
            return
        await self._terminate(shard)
        self._stop_following(shard)
        shard.status.last_output_lines = self._tail(shard)
        self._forget(shard)
        raise RuntimeError(problem)

    async def _give_up(self, shard: Shard) -> str:
        msg = f"not ready within {self.cfg.ready_timeout_s:g}s ({shard.status.engine} health check)"
        await self._terminate(shard)
        self._stop_following(shard)
        shard.status.last_output_lines = self._tail(shard)
        self._forget(shard)
        return msg

    def _alive(self, shard: Shard) -> bool:
        pid = shard.status.pid
        return pid is not None and proc_start_time(pid) == shard.start_ticks

    async def _poll_exit(self, shard: Shard) -> None:
        # Not our child (or not yet reaped): /proc is the only signal there is, so poll it.
        while self._alive(shard):  # noqa: ASYNC110
            await asyncio.sleep(self.cfg.poll_interval_s)

    def _exited(self, shard: Shard, code: int | None) -> None:
        self._stop_following(shard)
        lines = self._tail(shard)
        self._forget(shard)
        shard.exited.set()
        if shard.stopping:
            self._set(shard, state="stopped", exit_code=code, last_output_lines=lines, message="stopped")
            return
        key = (shard.spec.model, shard.spec.engine)
        self.engine_exits[key] = self.engine_exits.get(key, 0) + 1
        self._kill_leftovers(shard)
        how = "exit status unknown (adopted process)" if code is None else describe_exit(code)
        self._set(
            shard, state="failed", exit_code=code, last_output_lines=lines, message=f"engine exited: {how}"
        )

    def _kill_leftovers(self, shard: Shard) -> None:
        """The shard's first process died on its own (the pass-through killed, a crash): what is left of its
        group (the engine under a pass-through, workers) would hold the port and the GPU memory with nobody
        watching it. The group id cannot be reused while any member lives, so a live group is still this one."""
        pgid = shard.pgid
        if pgid is None or not group_alive(pgid):
            return
        log.warning(
            "shard %s: its process %s exited; killing what is left of its group", shard.spec.shard_id, pgid
        )
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    # ---- stop ----

    async def stop(self, replica_id: str, shard_rank: int | None = None) -> list[ShardStatus]:
        """Stop every shard of `replica_id` on this node (or one rank): SIGTERM the group, SIGKILL after grace."""
        found = [
            s
            for s in self.shards.values()
            if s.spec.replica_id == replica_id and shard_rank in (None, s.spec.shard_rank)
        ]
        for shard in found:
            await self._stop_one(shard)
        return [s.status.model_copy() for s in found]

    async def _stop_one(self, shard: Shard) -> None:
        if shard.status.state in ("stopped", "failed") and not (shard.pgid and self._alive(shard)):
            shard.status.state = "stopped"
            return
        shard.stopping = True
        self._set(shard, state="stopping")
        if shard.task and shard.status.pid is None:
            shard.task.cancel()  # still fetching
            with contextlib.suppress(asyncio.CancelledError):
                await shard.task
            self.weights_index.release(shard.spec.shard_id)
            self._set(shard, state="stopped", message="stopped while fetching")
            return
        await self._terminate(shard)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(shard.exited.wait(), timeout=5)
        if shard.status.state != "stopped":
            self._stop_following(shard)
            self._forget(shard)
            self._set(shard, state="stopped", message="stopped")

    async def _terminate(self, shard: Shard) -> None:
        pgid = shard.pgid
        if pgid is None or not (shard.proc is not None or self._alive(shard)):
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        if not await self._wait_group_gone(shard, self.cfg.stop_grace_s):
            log.warning(
                "shard %s ignored SIGTERM for %gs: SIGKILL", shard.spec.shard_id, self.cfg.stop_grace_s
            )
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            await self._wait_group_gone(shard, 10.0)

    async def _wait_group_gone(self, shard: Shard, limit_s: float) -> bool:
        assert shard.pgid is not None
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if shard.proc is not None and shard.proc.returncode is None:
                # Our own child: reap it, or its zombie keeps the group "alive".
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(shard.proc.wait()), 0.1)
            if not group_alive(shard.pgid):
                return True
            await asyncio.sleep(0.05)
        return not group_alive(shard.pgid)

    # ---- persistence and adoption ----

    def _state_file(self, shard_id: str) -> Path:
        return self.cfg.state_dir / "shards" / f"{shard_id}.json"

    def _persist(self, shard: Shard) -> None:
        write_record(self._state_file(shard.spec.shard_id), shard)

    def _forget(self, shard: Shard) -> None:
        self._state_file(shard.spec.shard_id).unlink(missing_ok=True)
        self.weights_index.release(shard.spec.shard_id)

    def adopt(self) -> list[ShardStatus]:
        """Re-adopt engines recorded in the state dir that are still the same running process."""
        adopted: list[ShardStatus] = []
        for path in sorted((self.cfg.state_dir / "shards").glob("*.json")):
            try:
                record = read_record(path)
            except ValueError as exc:
                log.warning("ignoring unreadable shard state %s: %s", path, exc)
                continue
            spec, status, pid, ticks = record.spec, record.status, record.pid, record.start_ticks
            problem = repo_rules.replica_id_problem(spec.replica_id)
            if problem:  # written by an agent that predates the check: its work dir may be anywhere
                log.warning("ignoring shard state %s: %s", path, problem)
                continue
            if ticks is None or proc_start_time(pid) != ticks:
                log.info("shard %s: pid %s is gone or is another process; not adopting", spec.shard_id, pid)
                path.unlink(missing_ok=True)
                continue
            shard = record.shard(self.cfg.state_dir / "work" / spec.shard_id)
            # The key is not in the state file; the engine's own environment still holds it (same user).
            shard.redact = redact.redactor(redact.secret_values(os.environ, spec.env, proc_environ(pid)))
            self._follow_output(shard, from_end=True)
            self.shards[spec.shard_id] = shard
            self.engine_exits.setdefault((spec.model, spec.engine), 0)
            shard.task = asyncio.create_task(self._watch_adopted(shard), name=f"adopted-{spec.shard_id}")
            adopted.append(status.model_copy())
        self.weights_index.retain_users(self.shards)
        return adopted

    async def _watch_adopted(self, shard: Shard) -> None:
        try:
            if shard.status.state != "ready" and shard.probe_url:
                await self._wait_ready(shard)
            await self._poll_exit(shard)
            self._exited(shard, None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._set(shard, state="failed", message=str(exc))
            shard.exited.set()

    async def close(self) -> None:
        """Stop watching; engines keep running (they are re-adopted by the next agent)."""
        if self._pump_task is not None:
            self._pump_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump_task
        for shard in self.shards.values():
            if shard.task:
                shard.task.cancel()
        for shard in self.shards.values():
            if shard.task:
                with contextlib.suppress(asyncio.CancelledError):
                    await shard.task

    async def stop_all(self) -> None:
        for shard in list(self.shards.values()):
            await self._stop_one(shard)
