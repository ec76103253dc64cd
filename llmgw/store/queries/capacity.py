"""Measured capacity: the store's queries for `llmgw bench --save` and `llmgw capacity`, mixed into `Store`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from llmgw.store.db import Backend, Row

__all__ = ["CapacityQueries", "CapacityRecord"]

_COLUMNS = (
    "model, profile, gpu_class, engine, measured_at, objective_ms, concurrency, tokens_per_s, "
    "prefill_ms_per_token, decode_ms_per_token, load_s, replica, curve"
)


@dataclass(frozen=True)
class CapacityRecord:
    """One replica's measured capacity; `gpu_class` is "" for a CPU profile; None fields were not measured."""

    model: str
    profile: str
    gpu_class: str
    engine: str
    measured_at: float
    objective_ms: float | None
    concurrency: int | None
    tokens_per_s: float | None
    prefill_ms_per_token: float | None
    decode_ms_per_token: float | None
    load_s: float | None
    replica: str = ""
    curve: list[dict[str, Any]] = field(default_factory=list)


def _opt(value: Any) -> float | None:
    return None if value is None else float(value)


def _record(r: Row) -> CapacityRecord:
    return CapacityRecord(
        model=r[0],
        profile=r[1],
        gpu_class=r[2],
        engine=r[3],
        measured_at=float(r[4]),
        objective_ms=_opt(r[5]),
        concurrency=None if r[6] is None else int(r[6]),
        tokens_per_s=_opt(r[7]),
        prefill_ms_per_token=_opt(r[8]),
        decode_ms_per_token=_opt(r[9]),
        load_s=_opt(r[10]),
        replica=r[11],
        curve=json.loads(r[12]),
    )


class CapacityQueries:
    db: Backend

    async def save_capacity(self, rec: CapacityRecord) -> None:
        """Record a measurement, replacing the one before for the same model, profile and GPU class."""
        async with self.db.tx() as tx:
            await tx.execute(
                f"INSERT INTO capacity ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (model, profile, gpu_class) DO UPDATE SET engine = excluded.engine, "
                "measured_at = excluded.measured_at, objective_ms = excluded.objective_ms, "
                "concurrency = excluded.concurrency, tokens_per_s = excluded.tokens_per_s, "
                "prefill_ms_per_token = excluded.prefill_ms_per_token, "
                "decode_ms_per_token = excluded.decode_ms_per_token, load_s = excluded.load_s, "
                "replica = excluded.replica, curve = excluded.curve",
                (
                    rec.model,
                    rec.profile,
                    rec.gpu_class,
                    rec.engine,
                    rec.measured_at,
                    rec.objective_ms,
                    rec.concurrency,
                    rec.tokens_per_s,
                    rec.prefill_ms_per_token,
                    rec.decode_ms_per_token,
                    rec.load_s,
                    rec.replica,
                    json.dumps(rec.curve, sort_keys=True),
                ),
            )

    async def list_capacity(self, model: str | None = None) -> list[CapacityRecord]:
        where, params = ("WHERE model = ?", (model,)) if model else ("", ())
        async with self.db.tx() as tx:
            rows = await tx.fetch(
                f"SELECT {_COLUMNS} FROM capacity {where} ORDER BY model, profile, gpu_class", params
            )
        return [_record(r) for r in rows]
