"""Thousands of open streams through one proxy: memory per stream, CPU per event, added inter-event latency.

One run, one mock upstream, the proxies one after another (each started just before its turn and stopped
after it, so an idle one costs the next nothing):
  llmgw        llmgw-router with every check on (benchmarks/every_check.py, named on the last line)
  floor        a ~20-line aiohttp pass-through: the least any Python proxy does
  vllm-router  PyPI `vllm-router` (Rust), one worker, round robin; skipped with a message when it cannot start

The mock is a raw asyncio (uvloop) server that answers every chat completion with a stream of pre-rendered SSE
chunk events, one every 0.5 s (2 events/s per stream), each carrying the mock's send time (CLOCK_MONOTONIC, which
every process on the machine shares) in `system_fingerprint`; the only per-event work is splicing that stamp in.
Its CPU is reported so a reader can see it was never the limit. The load generator is this process: raw
asyncio protocols on uvloop (no HTTP client library), opening the streams at an even rate over a ramp so that
their events are spread in time rather than arriving in lockstep.

Measured per proxy (its whole process tree, from /proc):
  kb_per_stream     (RSS with every stream open - RSS idle after a warm-up) / streams open
  cpu_us_per_event  user + system CPU over the run / events delivered (each stream's request, connection and
                    set-up are part of the cost, spread over its events)
  added p50/p99     per event after a stream's first: the gap between two arrivals at the client minus the gap
                    between the mock's two sends
  stalls            events whose added gap exceeds 1 s
The last line is machine-readable (llmgw's figures, the floor's and the vLLM router's CPU beside them):

  streams: features=keys+limits3+... n=2000 kb_per_stream=X cpu_us_per_event=X floor_cpu_us_per_event=X vllm_router_cpu_us_per_event=X
  added_p99_ms=X stalls=N

2,000 streams need about 2 x 2,000 open files in the proxy (client and upstream sockets) and 2,000 here: the
run raises its own soft limit to the hard one (children inherit it) and says so when the hard limit is short.
Run: .venv/bin/python benchmarks/streams.py [--streams 2000] [--events 25] [--ramp 4] [--no-vllm-router]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import every_check
from harness import Procs, free_port, raise_fd_limit, tree_cpu_seconds, tree_pids, tree_rss_bytes, wait_http
from peers import MODEL, Target, start_floor, start_llmgw, start_vllm_router

GAP_S = 0.5  # 2 events/s per stream
STALL_S = 1.0
STAMP = b'"system_fingerprint":"'

MOCK = r"""
import asyncio, json, sys, time
GAP = float(sys.argv[2])
HEAD = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"bench-model","system_fingerprint":"'
def tail(finish):
    return ('","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":' + finish + '}]}\n\n').encode()
def framed(mid):  # one HTTP chunk around one event whose 17-byte stamp is spliced in at send time
    size = len(HEAD) + 17 + len(mid)
    return b"%x\r\n" % size + HEAD, mid + b"\r\n"
EVENT, LAST = framed(tail("null")), framed(tail('"stop"'))
DONE = b"data: [DONE]\n\n"
END = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)
STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
open_streams = 0
def small(body, ctype=b"application/json"):
    return b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s" % (ctype, len(body), body)
class Mock(asyncio.Protocol):
    def connection_made(self, transport):
        self.t, self.buf, self.timer, self.busy = transport, b"", None, False
    def connection_lost(self, exc):
        global open_streams
        if self.timer is not None:
            self.timer.cancel()
            open_streams -= 1
    def data_received(self, data):
        self.buf += data
        while not self.busy:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4:end + 4 + length], self.buf[end + 4 + length:]
            self.answer(head.split(" ", 2), body)
    def answer(self, first, body):
        global open_streams
        method, path = first[0], first[1].split("?")[0]
        if method == "POST" and path.endswith("/chat/completions"):
            self.busy = True
            open_streams += 1
            self.events = int(json.loads(body).get("max_tokens") or 25)  # events in this stream
            self.t.write(STREAM_HEAD)
            self.send(0, time.monotonic())
        elif path == "/metrics":
            self.t.write(small(b"vllm:num_requests_running %d\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n" % open_streams, b"text/plain"))
        elif path.endswith("/models"):
            self.t.write(small(b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}'))
        else:
            self.t.write(small(b"ok", b"text/plain"))
    def send(self, k, start):
        global open_streams
        head, rest = LAST if k == self.events - 1 else EVENT
        self.t.write(head + b"%017.6f" % time.monotonic() + rest)
        if k < self.events - 1:
            self.timer = asyncio.get_running_loop().call_at(start + (k + 1) * GAP, self.send, k + 1, start)
            return
        self.t.write(END)
        self.timer, self.busy = None, False
        open_streams -= 1
        if self.buf:
            self.data_received(b"")
async def main():
    server = await asyncio.get_running_loop().create_server(Mock, "127.0.0.1", int(sys.argv[1]), backlog=4096)
    await server.serve_forever()
try:
    import uvloop
    uvloop.run(main())
except ImportError:
    asyncio.run(main())
"""


@dataclass
class Tally:
    """What the generator saw, over every stream of one run."""

    expected_events: int
    events: int = 0
    done: int = 0
    open: int = 0
    errors: int = 0
    first_error: str = ""
    added_s: list[float] = field(default_factory=list)
    steady_from: float = math.inf  # monotonic time the last stream was opened: later sends are past the ramp
    steady_s: list[float] = field(default_factory=list)  # added gaps of events sent past the ramp

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


class StreamClient(asyncio.Protocol):
    """One streamed chat completion over a raw socket: the HTTP/1.1 response head, chunked framing, SSE events."""

    def __init__(self, request: bytes, tally: Tally, finished: asyncio.Future[None]) -> None:
        self.request, self.tally, self.finished = request, tally, finished
        self.transport: asyncio.Transport | None = None
        self.head_done = self.chunked = self.counted_open = False
        self.raw = b""  # bytes not yet unframed
        self.body = b""  # unframed bytes not yet split into events
        self.chunk_left = 0  # data bytes left in the current chunk; -1: its CRLF is due
        self.events = 0
        self.last: tuple[float, float] | None = None  # (arrival, send stamp) of the previous event

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        transport.write(self.request)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.finished.done():
            self.end(f"connection closed after {self.events} events ({exc or 'EOF'})")

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        if not self.head_done:
            self.raw += data
            end = self.raw.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data, self.raw = self.raw[:end].lower(), self.raw[end + 4 :], b""
            if not head.startswith((b"http/1.1 200", b"http/1.0 200")):
                self.end(f"status {head.split(b' ', 2)[1].decode(errors='replace')}")
                return
            self.head_done, self.chunked = True, b"transfer-encoding: chunked" in head
            self.tally.open += 1
            self.counted_open = True
        self.body += self.unframe(data) if self.chunked else data
        self.take_events(now)

    def unframe(self, data: bytes) -> bytes:
        self.raw += data
        out = []
        while self.raw:
            if self.chunk_left > 0:
                piece = self.raw[: self.chunk_left]
                out.append(piece)
                self.raw, self.chunk_left = self.raw[len(piece) :], self.chunk_left - len(piece)
                if self.chunk_left == 0:
                    self.chunk_left = -1
            elif self.chunk_left < 0:
                if len(self.raw) < 2:
                    break
                self.raw, self.chunk_left = self.raw[2:], 0
            else:
                line_end = self.raw.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(self.raw[:line_end].split(b";")[0], 16)
                self.raw, self.chunk_left = self.raw[line_end + 2 :], size or 0
                if size == 0:
                    self.raw = b""
                    break
        return b"".join(out)

    def take_events(self, now: float) -> None:
        while (end := self.body.find(b"\n\n")) >= 0:
            event, self.body = self.body[:end], self.body[end + 2 :]
            at = event.find(STAMP)
            if at >= 0:
                sent = float(event[at + len(STAMP) : at + len(STAMP) + 17])
                if self.last is not None:
                    added = (now - self.last[0]) - (sent - self.last[1])
                    self.tally.added_s.append(added)
                    if sent > self.tally.steady_from:
                        self.tally.steady_s.append(added)
                self.last = (now, sent)
                self.events += 1
                self.tally.events += 1
            elif event.startswith(b"data: [DONE]"):
                self.end(None if self.events == self.tally.expected_events else f"{self.events} events")
                return

    def end(self, error: str | None) -> None:
        if self.finished.done():
            return
        if error:
            self.tally.fail(error)
        else:
            self.tally.done += 1
        if self.counted_open:
            self.tally.open -= 1
        self.finished.set_result(None)
        if self.transport is not None:
            self.transport.close()


def chat_request(target: Target, events: int) -> bytes:
    """The mock streams max_tokens events."""
    ask = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": events,
        "stream": True,
    }
    body = json.dumps(ask).encode()
    host = target.url.removeprefix("http://")
    headers = {
        "Host": host,
        "Content-Type": "application/json",
        "Content-Length": str(len(body)),
        **target.headers,
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"POST /v1/chat/completions HTTP/1.1\r\n{head}\r\n".encode() + body


async def run_streams(
    target: Target, n: int, events: int, ramp_s: float, on_sample: Callable[[int], None] | None = None
) -> Tally:
    """n streams opened evenly over ramp_s; on_sample(open streams) runs every 0.5 s until all have ended."""
    loop = asyncio.get_running_loop()
    tally, request = Tally(events), chat_request(target, events)
    host, port = target.url.removeprefix("http://").rsplit(":", 1)
    limit_s = ramp_s + events * GAP_S + 60

    async def one(delay: float) -> None:
        await asyncio.sleep(delay)
        finished: asyncio.Future[None] = loop.create_future()
        client = StreamClient(request, tally, finished)
        try:
            await loop.create_connection(lambda: client, host, int(port))
            await asyncio.wait_for(asyncio.shield(finished), limit_s)
        except (OSError, TimeoutError) as exc:
            client.end(f"{type(exc).__name__}: {exc}" if str(exc) else f"no end within {limit_s:g} s")

    tally.steady_from = time.monotonic() + ramp_s + 0.5  # the last stream has opened and had its first event
    streams = asyncio.gather(*(one(i * ramp_s / n) for i in range(n)))
    while not streams.done():
        if on_sample is not None:
            on_sample(tally.open)
        await asyncio.wait([streams], timeout=0.5)
    await streams
    return tally


@dataclass
class Report:
    name: str
    tally: Tally
    seconds: float
    cpu_s: float
    idle_rss: int
    open_rss: int
    peak_open: int
    mock_cpu_s: float
    generator_cpu_s: float

    @property
    def kb_per_stream(self) -> float:
        return (self.open_rss - self.idle_rss) / max(self.peak_open, 1) / 1024

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s / max(self.tally.events, 1) * 1e6

    def added_ms(self, q: float, steady: bool = False) -> float:
        added = sorted(self.tally.steady_s if steady else self.tally.added_s)
        return added[min(len(added) - 1, math.ceil(q * len(added)) - 1)] * 1000 if added else float("nan")

    @property
    def stalls(self) -> int:
        return sum(1 for a in self.tally.added_s if a > STALL_S)


def measure(runner: asyncio.Runner, target: Target, mock_pid: int, args: argparse.Namespace) -> Report:
    """A warm-up, the idle RSS, then the run with the tree's RSS sampled while streams are open."""
    assert target.proc is not None
    root = target.proc.pid
    runner.run(run_streams(target, min(50, args.streams), 2, 0.5))  # code paths and pools, not measured
    time.sleep(1.0)
    pids = tree_pids(root)  # the workers are up by now; sampling only these keeps the generator's loop free
    idle_rss = tree_rss_bytes(root, pids)
    peak = [0, idle_rss]  # most streams open seen, and the tree's RSS at that moment (the largest if tied)

    def sample(open_now: int) -> None:
        rss = tree_rss_bytes(root, pids)
        if open_now > peak[0] or (open_now == peak[0] and rss > peak[1]):
            peak[:] = [open_now, rss]

    ramp = min(args.ramp, args.events * GAP_S / 2)
    cpu0, mock0, gen0, t0 = (
        tree_cpu_seconds(root),
        tree_cpu_seconds(mock_pid),
        time.process_time(),
        time.monotonic(),
    )
    tally = runner.run(run_streams(target, args.streams, args.events, ramp, sample))
    seconds = time.monotonic() - t0
    return Report(
        target.name,
        tally,
        seconds,
        tree_cpu_seconds(root) - cpu0,
        idle_rss,
        peak[1],
        peak[0],
        tree_cpu_seconds(mock_pid) - mock0,
        time.process_time() - gen0,
    )


def print_table(reports: list[Report]) -> None:
    """+p99 past ramp: only events sent after every stream had opened (the ramp's connection set-ups are over)."""
    print(
        f"\n{'target':<13}{'ok':>6}{'errors':>7}{'open':>6}{'idle MB':>9}{'open MB':>9}{'KB/stream':>10}"
        f"{'cpu us/ev':>10}{'+p50 ms':>9}{'+p99 ms':>9}{'+p99 past ramp':>15}{'+max ms':>9}{'stalls':>7}"
        f"{'mock cpu':>9}{'gen cpu':>8}"
    )
    for r in reports:
        added = r.tally.added_s
        print(
            f"{r.name:<13}{r.tally.done:>6}{r.tally.errors:>7}{r.peak_open:>6}{r.idle_rss / 2**20:>9.1f}"
            f"{r.open_rss / 2**20:>9.1f}{r.kb_per_stream:>10.1f}{r.cpu_us_per_event:>10.1f}{r.added_ms(0.5):>9.2f}"
            f"{r.added_ms(0.99):>9.2f}{r.added_ms(0.99, steady=True):>15.2f}"
            f"{(max(added) * 1000 if added else float('nan')):>9.1f}{r.stalls:>7}"
            f"{r.mock_cpu_s / r.seconds:>9.0%}{r.generator_cpu_s / r.seconds:>8.0%}"
        )
        if r.tally.errors:
            print(f"  {r.name}: {r.tally.errors} streams failed, the first: {r.tally.first_error}")
        if r.mock_cpu_s / r.seconds > 0.7:
            print(
                f"  {r.name}: the mock used {r.mock_cpu_s / r.seconds:.0%} of a core: it may have been the limit"
            )


def final_line(n: int, reports: dict[str, Report]) -> str:
    def cpu(name: str) -> str:
        return f"{reports[name].cpu_us_per_event:.1f}" if name in reports else "none"

    llmgw = reports["llmgw"]
    return (
        f"streams: features={every_check.features()} n={n} kb_per_stream={llmgw.kb_per_stream:.1f} cpu_us_per_event={cpu('llmgw')} "
        f"floor_cpu_us_per_event={cpu('floor')} vllm_router_cpu_us_per_event={cpu('vllm-router')} "
        f"added_p99_ms={llmgw.added_ms(0.99):.2f} stalls={llmgw.stalls}"
    )


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--streams", type=int, default=2000, help="concurrent streams per proxy")
    ap.add_argument("--events", type=int, default=25, help="events per stream, 0.5 s apart")
    ap.add_argument(
        "--ramp", type=float, default=4.0, help="seconds over which the streams open (at most half a stream)"
    )
    ap.add_argument("--workers", type=int, default=1, help="llmgw-router worker processes (passed when > 1)")
    ap.add_argument("--no-vllm-router", action="store_true")
    args = ap.parse_args()
    if args.streams < 1 or args.events < 2:
        ap.error("--streams must be at least 1 and --events at least 2 (an added gap needs two events)")
    return args


def new_runner() -> asyncio.Runner:
    try:
        import uvloop

        factory: Any = uvloop.new_event_loop
    except ImportError:
        factory = None
    return asyncio.Runner(loop_factory=factory)


def main() -> None:
    args = parse_args()
    raise_fd_limit(2 * args.streams + 200)
    work = Path(tempfile.mkdtemp(prefix="llmgw-streams-"))
    procs = Procs(work)
    reports: dict[str, Report] = {}
    try:
        mock_port = free_port()
        (work / "mock.py").write_text(MOCK)
        mock = procs.start([sys.executable, str(work / "mock.py"), str(mock_port), str(GAP_S)])
        upstream = f"http://127.0.0.1:{mock_port}"
        wait_http(upstream + "/health", proc=mock)
        starters: list[Callable[[], Target | None]] = [
            lambda: start_llmgw(procs, work, upstream, args.workers),
            lambda: start_floor(procs, work, upstream),
        ]
        if not args.no_vllm_router:
            starters.append(lambda: start_vllm_router(procs, work, upstream))
        with new_runner() as runner:
            for start in starters:
                target = start()
                if target is None:
                    continue
                assert target.proc is not None
                reports[target.name] = measure(runner, target, mock.pid, args)
                procs.stop(target.proc)
        print_table(list(reports.values()))
        print(final_line(args.streams, reports))
    finally:
        procs.stop_all()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
