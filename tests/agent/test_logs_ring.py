"""The agent's log ring: bounded by lines and by bytes, queried by cursor, time, grep and source; engine
output followed from its file (partial lines, a replaced file), redacted on the way in; the agent's own log
records in it; each engine's memory measured, unknown as None."""

from __future__ import annotations

import asyncio
import logging
import re
import sys
from pathlib import Path

import pytest
from llmgw_agent import engine_memory
from llmgw_agent.logring import LINE_OVERHEAD, MAX_LINE_BYTES, LogRing, OutputTail, RingHandler
from llmgw_agent.redact import MASK, redactor, secret_values


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


def test_the_ring_drops_the_oldest_past_its_line_bound() -> None:
    ring = LogRing(max_lines=100, max_bytes=10**6)
    for n in range(250):
        ring.append("r1", f"line {n}")
    page = ring.query(after=0, limit=1000)
    assert [line.text for line in page.lines] == [f"line {n}" for n in range(150, 250)]
    assert page.missed == 150 and ring.first_seq == 151 and ring.last_seq == 250


def test_the_ring_drops_the_oldest_past_its_byte_bound_counting_each_line_s_overhead() -> None:
    budget = 20 * (LINE_OVERHEAD + 2 + 100)
    ring = LogRing(max_lines=10**6, max_bytes=max(budget, LINE_OVERHEAD + MAX_LINE_BYTES))
    for _ in range(1000):
        ring.append("r1", "x" * 100)
    held = ring.query(after=0, limit=1000).lines
    assert 0 < len(held) < 1000
    assert sum(len(line.text) + len(line.source) + LINE_OVERHEAD for line in held) <= ring.max_bytes
    for _ in range(10_000):  # empty lines cost their overhead: a flood of them is bounded too
        ring.append("r1", "")
    assert len(ring.query(after=0, limit=1000).lines) <= ring.max_bytes // LINE_OVERHEAD


def test_a_long_line_is_cut_and_says_so() -> None:
    ring = LogRing()
    line = ring.append("r1", "é" * MAX_LINE_BYTES)
    assert len(line.text.encode()) <= MAX_LINE_BYTES and line.text.endswith(
        f"[cut: {2 * MAX_LINE_BYTES} bytes]"
    )


def test_query_tail_forward_since_grep_and_source() -> None:
    ring = LogRing(clock=Clock())
    for n in range(10):
        ring.append("r1" if n % 2 else "agent", f"msg {n}", shard=0 if n % 2 else None)
    tail = ring.query(limit=3)
    assert [line.text for line in tail.lines] == ["msg 7", "msg 8", "msg 9"] and tail.next_after == 10
    forward = ring.query(after=2, limit=3)
    assert [line.seq for line in forward.lines] == [3, 4, 5] and forward.more and forward.next_after == 5
    rest = ring.query(after=forward.next_after, limit=100)
    assert [line.seq for line in rest.lines] == [6, 7, 8, 9, 10] and not rest.more
    assert [line.text for line in ring.query(since=1008.0, limit=100).lines] == ["msg 7", "msg 8", "msg 9"]
    assert [line.text for line in ring.query(grep=re.compile(r"[13]$"), limit=100).lines] == [
        "msg 1",
        "msg 3",
    ]
    only = ring.query(source="r1", limit=100).lines
    assert [line.text for line in only] == ["msg 1", "msg 3", "msg 5", "msg 7", "msg 9"]
    assert ring.tail("r1", 0, 2) == ["msg 7", "msg 9"]
    # A filter that matches nothing still moves the cursor over what was scanned: a follower never rescans it.
    none = ring.query(after=0, grep=re.compile("nothing"), limit=5)
    assert none.lines == [] and none.next_after == 10 and not none.more


async def test_wait_past_wakes_on_a_line_from_another_thread() -> None:
    ring = LogRing()
    ring.append("agent", "first")
    waiting = asyncio.create_task(ring.wait_past(ring.last_seq, 10))
    await asyncio.sleep(0.05)
    await asyncio.to_thread(ring.append, "agent", "from a worker thread")
    assert await asyncio.wait_for(waiting, 5)
    assert not await ring.wait_past(ring.last_seq, 0.05)  # nothing new: the wait times out


def test_output_tail_reads_whole_lines_redacts_them_and_follows_a_replaced_file(tmp_path: Path) -> None:
    key = "engine-key-abcdef0123456789"
    ring = LogRing()
    out = tmp_path / "output.log"
    out.write_bytes(b"")
    tail = OutputTail(ring, out, "r1", 0, redactor(secret_values(extra=[key])))
    with out.open("ab") as f:
        f.write(f"key={key}\nAuthorization: Bearer sk-abc\npart".encode())
    assert tail.drain() == 2
    assert ring.tail("r1", 0, 10) == [f"key={MASK}", f"Authorization: Bearer {MASK}"]
    with out.open("ab") as f:
        f.write(b"ial line\r\n")
    tail.drain()
    assert ring.tail("r1", 0, 1) == ["partial line"]
    out.write_bytes(b"restarted\nno newline yet")  # the same shard started again: the file starts over
    tail.drain(final=True)
    assert ring.tail("r1", 0, 2) == ["restarted", "no newline yet"]


def test_output_tail_of_an_adopted_engine_starts_at_the_end(tmp_path: Path) -> None:
    ring = LogRing()
    out = tmp_path / "output.log"
    out.write_bytes(b"from before this agent\n")
    tail = OutputTail(ring, out, "r1", 0, lambda line: line, from_end=True)
    with out.open("ab") as f:
        f.write(b"after\n")
    tail.drain()
    assert ring.tail("r1", 0, 10) == ["after"]


def test_the_agent_s_own_records_enter_the_ring_redacted() -> None:
    ring = LogRing()
    logger = logging.getLogger("llmgw_agent.test_ring")
    handler = RingHandler(ring, redactor(secret_values(extra=["node-token-123456"])))
    logger.addHandler(handler)
    try:
        logger.warning("mirror said no to node-token-123456 and Bearer abc.def")
    finally:
        logger.removeHandler(handler)
    (line,) = ring.query(source="agent").lines
    assert line.text == f"WARNING llmgw_agent.test_ring: mirror said no to {MASK} and Bearer {MASK}"
    assert line.shard is None


def test_compute_apps_parse_and_unknown_stays_none() -> None:
    text = "4242, 10240\n4243, [N/A]\n4242, 1024\n"
    assert engine_memory.parse_compute_apps(text) == {4242: 11264 * 1024 * 1024}
    with pytest.raises(ValueError, match="expected 2"):
        engine_memory.parse_compute_apps("1, 2, 3\n")
    procs = {10: (10, 4096), 11: (10, 8192), 20: (20, 1000)}
    groups = engine_memory.by_group([10, 20, 30], procs, {11: 500})
    assert groups[10] == (12288, 500)  # the group's members summed
    assert groups[20] == (1000, 0)  # nvidia-smi answered and listed none of it: a measured 0
    assert groups[30] == (None, None)  # no such group: unknown
    assert engine_memory.by_group([10], procs, None)[10] == (12288, None)  # no nvidia-smi: GPU unknown


def test_nvidia_smi_compute_apps_through_a_stand_in(tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "assert sys.argv[1:] == ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits']\n"
        "print('77, 300')\n"
    )
    smi.chmod(0o755)
    assert engine_memory.gpu_memory_by_pid(str(smi)) == {77: 300 * 1024 * 1024}
    failing = tmp_path / "failing-smi"
    failing.write_text("#!/bin/sh\nexit 9\n")
    failing.chmod(0o755)
    assert engine_memory.gpu_memory_by_pid(str(failing)) is None
    assert engine_memory.gpu_memory_by_pid(str(tmp_path / "absent")) is None


def test_this_process_group_has_a_resident_size() -> None:
    import os

    (rss, _) = engine_memory.measure([os.getpgrp()], nvidia_smi="/nonexistent/nvidia-smi")[os.getpgrp()]
    assert rss is not None and rss > 1024 * 1024


async def test_the_logs_command_long_polls_and_reads_another_boot_s_cursor_from_the_first_line(
    tmp_path: Path,
) -> None:
    from llmgw_agent.config import AgentConfig
    from llmgw_agent.daemon import Agent
    from llmgw_agent.protocol import LogQuery

    agent = Agent(AgentConfig(controllers=["127.0.0.1:9"], state_dir=str(tmp_path)))
    for n in range(3):
        agent.ring.append("r1", f"old {n}", 0)
    first = await agent.read_logs(LogQuery())
    assert [x["text"] for x in first["lines"]] == ["old 0", "old 1", "old 2"] and first[
        "boot"
    ] == agent.ring.boot
    # A follower's long poll: nothing yet past its cursor, so the agent waits until a line comes.
    polled = asyncio.create_task(
        agent.read_logs(LogQuery(boot=first["boot"], after=first["next_after"], wait_s=20))
    )
    await asyncio.sleep(0.1)
    assert not polled.done()
    agent.ring.append("r1", "new", 0)
    page = await asyncio.wait_for(polled, 5)
    assert [x["text"] for x in page["lines"]] == ["new"] and page["missed"] == 0
    quiet = await agent.read_logs(LogQuery(boot=page["boot"], after=page["next_after"], wait_s=0.1))
    assert quiet["lines"] == [] and quiet["next_after"] == page["next_after"]
    # A cursor from an earlier agent process: this one's lines are all new to the reader.
    other = await agent.read_logs(LogQuery(boot="another-boot", after=999, limit=2))
    assert [x["text"] for x in other["lines"]] == ["old 0", "old 1"] and other["more"]
    with pytest.raises(ValueError, match="not a regular expression"):
        await agent.read_logs(LogQuery(grep="("))
