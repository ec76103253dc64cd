"""What an anonymous flood costs an authenticated client (H6): the latency of a tenant's request while 512
anonymous connections from the tenant's own address hold the review's exploit (a head with Content-Length,
then no body) and a 400 KB prompt is screened by an e-mail guardrail, against the same router unloaded, in
one run.

llmgw-router as a process (benchmarks/peers.py: a store with one key, the mock upstream of
router_overhead.py), its default listener settings, and a guardrail (`pii: [email]`) on the model. Each
measured request opens its own connection (so each is admitted under the per-address cap, where the flood
is) and is timed from connect to the end of its answer. Phases, in order: warm-up, unloaded, flooded (the
flood opened and, with --prompt-bytes, a thread sending the big prompt again and again while it lasts).
The last line is machine-readable:

  listener_flood: unloaded_p50_ms=X unloaded_p99_ms=X flooded_p50_ms=X flooded_p99_ms=X ratio_p50=X
  ratio_p99=X idle=N prompt_bytes=N prompts_answered=N

(one line). A ratio, never a wall-clock bound: the machine decides the milliseconds.

Run: .venv/bin/python benchmarks/listener_flood.py [--requests 200] [--idle 512] [--prompt-bytes 400000]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from harness import Procs, raise_fd_limit
from peers import MODEL, start_llmgw
from router_overhead import start_mock

STALLED = b"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 1000\r\n\r\n"
GUARD = {"guardrails": {"pii": {"mode": "redact", "pii": ["email"]}}, "models": {MODEL: ["pii"]}}


def request_bytes(headers: dict[str, str], text: str) -> bytes:
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    fields = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\n{fields}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body.encode()


def exchange(address: tuple[str, int], request: bytes, timeout_s: float) -> tuple[int, float]:
    """One request on a new connection: its status and the seconds from connect to the end of its answer."""
    began = time.perf_counter()
    with socket.create_connection(address, timeout=timeout_s) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):  # `Connection: close`: the answer ends with the connection
            answer += chunk
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
    return status, time.perf_counter() - began


def measure(address: tuple[str, int], request: bytes, count: int) -> list[float]:
    took = []
    for _ in range(count):
        status, seconds = exchange(address, request, 60.0)
        if status != 200:
            raise RuntimeError(f"an authenticated request was answered {status}, not 200")
        took.append(seconds * 1000)
    return took


def flood(address: tuple[str, int], count: int) -> list[socket.socket]:
    """`count` anonymous connections from this address, each holding a head whose body never comes."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(address, timeout=10)
        sock.sendall(STALLED)
        held.append(sock)
    return held


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) > 1 else values[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=200, help="authenticated requests timed in each phase")
    ap.add_argument("--idle", type=int, default=512, help="anonymous connections in the flood")
    ap.add_argument(
        "--prompt-bytes", type=int, default=400_000, help="the guarded prompt in flight (0: none)"
    )
    args = ap.parse_args()
    raise_fd_limit(4 * args.idle + 256)
    procs = Procs(Path(tempfile.mkdtemp(prefix="llmgw-bench-flood-")))
    try:
        upstream = start_mock(procs, procs.logs, None)
        target = start_llmgw(procs, procs.logs / "router", upstream, guard=GUARD)
        parts = urlsplit(target.url)
        address = (parts.hostname or "127.0.0.1", parts.port or 80)
        small = request_bytes(target.headers, "hello")
        measure(address, small, max(10, args.requests // 10))  # warm-up
        unloaded = measure(address, small, args.requests)

        held = flood(address, args.idle)
        stop = threading.Event()
        answered = [0]

        def prompts() -> None:
            big = request_bytes(target.headers, "a" * args.prompt_bytes + "@")
            while not stop.is_set():
                exchange(address, big, 600.0)
                answered[0] += 1

        sender = threading.Thread(target=prompts, daemon=True) if args.prompt_bytes else None
        if sender is not None:
            sender.start()
            time.sleep(0.5)  # the first big prompt is sent and being screened
        flooded = measure(address, small, args.requests)
        stop.set()
        if sender is not None:
            sender.join(600.0)  # the prompt in flight is answered before the count is read
        for sock in held:
            sock.close()
    finally:
        procs.stop_all()
    u50, f50 = statistics.median(unloaded), statistics.median(flooded)
    u99, f99 = p99(unloaded), p99(flooded)
    print(f"unloaded: p50 {u50:.2f} ms, p99 {u99:.2f} ms; flooded: p50 {f50:.2f} ms, p99 {f99:.2f} ms")
    print(
        f"listener_flood: unloaded_p50_ms={u50:.2f} unloaded_p99_ms={u99:.2f} flooded_p50_ms={f50:.2f} "
        f"flooded_p99_ms={f99:.2f} ratio_p50={f50 / u50:.2f} ratio_p99={f99 / u99:.2f} idle={args.idle} "
        f"prompt_bytes={args.prompt_bytes} prompts_answered={answered[0]}"
    )


if __name__ == "__main__":
    main()
