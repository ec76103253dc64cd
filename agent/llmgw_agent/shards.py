"""A shard the supervisor runs (`Shard`), and its record in the state dir: what a restarted agent reads to
re-adopt the engine (never the key: it is not written to disk).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmgw_agent import engines
from llmgw_agent.engine_process import OUTPUT_FILE, tail_lines
from llmgw_agent.logring import OutputTail
from llmgw_agent.protocol import ShardSpec, ShardStatus

__all__ = [
    "Shard",
    "ShardRecord",
    "file_tail",
    "free_cpus",
    "free_port",
    "read_record",
    "write_record",
]


@dataclass
class Shard:
    spec: ShardSpec
    status: ShardStatus
    workdir: Path
    health_path: str = "/health"
    probe_url: str | None = None  # where the agent itself checks readiness (the engine's own loopback port)
    engine_port: int | None = None  # the engine's loopback port when a pass-through fronts it
    # Hides the engine key and secret-looking env values in the output tail (rebuilt from the spec on adoption,
    # when the key itself is no longer known: the patterns still apply).
    redact: Callable[[str], str] = field(default=lambda line: line)
    output: OutputTail | None = None  # follows the output file into the log ring while the engine runs
    pgid: int | None = None
    start_ticks: int | None = None
    proc: asyncio.subprocess.Process | None = None
    task: asyncio.Task[None] | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    adapter_paths: tuple[tuple[str, str], ...] = ()  # (name, local path) of each LoRA adapter, once fetched
    cpus: tuple[int, ...] = ()  # the cores given to an engine that binds its threads (engines.pins_cpus)


def file_tail(shard: Shard) -> list[str]:
    return [shard.redact(line) for line in tail_lines(shard.workdir / OUTPUT_FILE)]


def write_record(path: Path, shard: Shard) -> None:
    """The shard's record, replaced whole (written beside, then renamed)."""
    record = {
        "spec": shard.spec.model_dump(mode="json", exclude={"api_key"}),  # the key is never written to disk
        "status": shard.status.model_dump(mode="json", exclude={"last_output_lines"}),
        "pid": shard.status.pid,
        "pgid": shard.pgid,
        "start_ticks": shard.start_ticks,
        "port": shard.status.port,
        "health_path": shard.health_path,
        "probe_url": shard.probe_url,
        "engine_port": shard.engine_port,
        "cpus": list(shard.cpus),
        "started_at": shard.status.started_at,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, path)


@dataclass(frozen=True)
class ShardRecord:
    """A shard's record as read back: enough to check its process is the same one, and to rebuild it."""

    spec: ShardSpec
    status: ShardStatus
    pid: int
    start_ticks: int | None
    fields: dict[str, Any]

    def shard(self, workdir: Path) -> Shard:
        """The shard again, adopted (its output's redaction is the caller's: the key is not in the record)."""
        shard = Shard(self.spec, self.status, workdir)
        shard.pgid, shard.start_ticks = self.fields.get("pgid") or self.pid, self.start_ticks
        shard.health_path = self.fields.get("health_path", "/health")
        shard.probe_url = self.fields.get("probe_url")
        shard.engine_port = self.fields.get("engine_port")
        shard.cpus = tuple(int(c) for c in self.fields.get("cpus") or ())
        shard.status.message = "adopted after agent restart"
        shard.status.gpus = list(
            self.spec.gpus
        )  # a record written before statuses carried them has the spec's
        return shard


def read_record(path: Path) -> ShardRecord:
    """A shard's record; ValueError saying what is wrong when it cannot be read."""
    try:
        record = json.loads(path.read_text())
        spec = ShardSpec.model_validate(record["spec"])
        status = ShardStatus.model_validate(record["status"])
        return ShardRecord(spec, status, int(record["pid"]), record["start_ticks"], record)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


def free_port(
    shards: Iterable[Shard], port_range: tuple[int, int], host: str, taken: frozenset[int] = frozenset()
) -> int:
    """The first port of `port_range` no live shard holds and `host` lets us bind (RuntimeError: none)."""
    used = {
        p
        for s in shards
        if s.status.state not in ("stopped", "failed")
        for p in (s.status.port, s.engine_port, s.status.kv_events_port)
        if p is not None
    } | taken
    lo, hi = port_range
    for port in range(lo, hi + 1):
        if port in used:
            continue
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {lo}-{hi} on {host}")


def free_cpus(shards: Iterable[Shard], shard: Shard) -> tuple[int, ...]:
    """The shard's cores (its profile's cpu_cores, else one): the node's usable cores the fewest live
    shards hold. Without this two vLLM replicas bind the same core (vLLM's `auto` takes core 0 on every
    one of them)."""
    in_use = [
        core
        for s in shards
        if s is not shard and s.status.state not in ("stopped", "failed")
        for core in s.cpus
    ]
    return engines.pick_cpus(sorted(os.sched_getaffinity(0)), in_use, shard.spec.cpu_cores or 1)
