"""The admin API's log cursor and the merge of several agents' pages (llmgw.core.api.logpage), and the JSON log
lines of the controller and router (llmgw.adapters.logformat)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import pytest

from llmgw.adapters import logformat
from llmgw.core.api.logpage import NodePage, Position, decode_cursor, encode_cursor, merge_pages


def _line(seq: int, time: float) -> dict[str, object]:
    return {"seq": seq, "time": time, "source": "r1", "shard": 0, "text": f"l{seq}"}


def test_a_cursor_round_trips_and_anything_else_is_refused() -> None:
    positions = {"n1": Position("b1", 7), "n2": Position("b2", 0)}
    assert decode_cursor(encode_cursor(positions)) == positions

    def b64(text: str) -> str:
        return base64.urlsafe_b64encode(text.encode()).decode()

    for bad in ("zzz", b64("[]"), b64('{"n1": ["b", -1]}'), b64('{"n1": ["b"]}'), b64('{"n1": ["b", true]}')):
        with pytest.raises(ValueError, match="pass back next_cursor"):
            decode_cursor(bad)


def test_a_forward_page_across_nodes_neither_repeats_nor_skips() -> None:
    a = NodePage("ba", [_line(1, 1.0), _line(2, 3.0), _line(3, 5.0)], next_after=3, more=False, missed=0)
    b = NodePage("bb", [_line(10, 2.0), _line(11, 4.0)], next_after=11, more=False, missed=2)
    merged = merge_pages({"n1": a, "n2": b}, 3, tail=False)
    assert [(x["node"], x["seq"]) for x in merged.lines] == [("n1", 1), ("n2", 10), ("n1", 2)]
    # n1's line 3 and n2's line 11 were left out: each node's position stops just before them.
    assert merged.positions == {"n1": Position("ba", 2), "n2": Position("bb", 10)}
    assert merged.more and merged.missed == 2


def test_a_tail_keeps_the_newest_and_moves_every_node_to_its_end() -> None:
    a = NodePage("ba", [_line(1, 1.0), _line(2, 3.0)], next_after=9, more=False, missed=0)
    b = NodePage("bb", [_line(10, 2.0)], next_after=10, more=False, missed=0)
    merged = merge_pages({"n1": a, "n2": b}, 2, tail=True)
    assert [x["seq"] for x in merged.lines] == [10, 2]
    assert merged.positions == {"n1": Position("ba", 9), "n2": Position("bb", 10)} and not merged.more


def test_json_log_lines_carry_the_ids_bound_to_the_task(capsys: pytest.CaptureFixture[str]) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logformat.JsonFormatter())
    logger = logging.getLogger("llmgw.test_logformat")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False

    async def request(rid: str) -> None:
        logformat.bind(request_id=rid)
        await asyncio.sleep(0)
        logger.info("answered %s", rid)

    async def both() -> None:
        await asyncio.gather(request("req-a"), request("req-b"))
        logger.warning("no request here", extra={"node": "n1"})

    try:
        asyncio.run(both())
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(r["message"], r.get("request_id")) for r in records[:2]] == [
        ("answered req-a", "req-a"),
        ("answered req-b", "req-b"),
    ]
    assert records[2] == {**records[2], "level": "WARNING", "logger": "llmgw.test_logformat", "node": "n1"}
    assert "request_id" not in records[2]  # each request's binding stayed in its own task
    assert records[0]["time"].endswith("+00:00") and "RuntimeError: boom" in records[3]["exception"]
    with pytest.raises(ValueError, match="expected one of text, json"):
        logformat.configure("INFO", "yaml")
