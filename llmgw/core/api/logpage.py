"""Log pages across nodes: the admin API's cursor, and how pages from several agents' rings make one.

A replica's shards may run on several nodes, each agent with its own ring; a page is their lines merged by time.
The cursor says, per node, the agent process (`boot`) and the last sequence number the reader has: it is opaque
to clients (base64 of JSON), who pass `next_cursor` back as it came.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Merged", "NodePage", "Position", "decode_cursor", "encode_cursor", "merge_pages"]


@dataclass(frozen=True)
class Position:
    boot: str
    after: int


@dataclass(frozen=True)
class NodePage:
    """One agent's answer to a `logs` command (llmgw_agent's read_logs payload)."""

    boot: str
    lines: list[dict[str, Any]]  # each with seq, time, source, shard, text
    next_after: int
    more: bool
    missed: int

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> NodePage:
        return cls(
            boot=str(payload["boot"]),
            lines=list(payload.get("lines") or []),
            next_after=int(payload["next_after"]),
            more=bool(payload.get("more")),
            missed=int(payload.get("missed") or 0),
        )


@dataclass(frozen=True)
class Merged:
    lines: list[dict[str, Any]]  # each line with its `node`
    positions: dict[str, Position]
    more: bool
    missed: int


def encode_cursor(positions: Mapping[str, Position]) -> str:
    data = {node: [p.boot, p.after] for node, p in sorted(positions.items())}
    return base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode()).decode().rstrip("=")


def decode_cursor(text: str) -> dict[str, Position]:
    """The positions in a cursor this API made; ValueError saying so for anything else."""
    bad = ValueError(f"cursor {text[:40]!r} is not one this API made: pass back next_cursor as it came")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        data = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise bad from None
    if not isinstance(data, dict):
        raise bad
    out: dict[str, Position] = {}
    for node, value in data.items():
        ok = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
        if not ok or not isinstance(value[1], int) or isinstance(value[1], bool) or value[1] < 0:
            raise bad
        out[str(node)] = Position(value[0], value[1])
    return out


def merge_pages(pages: Mapping[str, NodePage], limit: int, *, tail: bool) -> Merged:
    """Lines of every node's page in time order, at most `limit`: the newest when `tail`, else the oldest (a
    forward page). Each node's position moves to just before its first line left out, or to the end of what
    its agent scanned when none was left out, so the next page neither repeats nor skips a line."""
    tagged = [{**line, "node": node} for node, page in pages.items() for line in page.lines]
    tagged.sort(key=lambda x: (x["time"], x["node"], x["seq"]))
    kept, cut = (tagged[-limit:], tagged[:-limit]) if tail else (tagged[:limit], tagged[limit:])
    positions = {node: Position(page.boot, page.next_after) for node, page in pages.items()}
    if not tail:
        for line in reversed(cut):  # reversed: the first cut line of each node is the one that stays
            page = pages[line["node"]]
            positions[line["node"]] = Position(page.boot, int(line["seq"]) - 1)
    return Merged(
        kept,
        positions,
        more=any(p.more for p in pages.values()) or (bool(cut) and not tail),
        missed=sum(p.missed for p in pages.values()),
    )
