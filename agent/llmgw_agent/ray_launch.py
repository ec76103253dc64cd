"""One shard of a multi-node vLLM replica over Ray, as one supervised process (issue 19).

The supervisor runs one process group per shard and probes one health URL, so each shard of a Ray replica is this
launcher:

- rank 0, `head`: starts `ray start --block --head` on the fabric address, waits until the Ray cluster counts
  every node of the replica (printing how many joined, so a waiting head is visible in its output), then starts
  `vllm serve ... --distributed-executor-backend ray`, which serves the API and `/health` itself. It waits for
  its workers; it does not give up while they are placed and started elsewhere (the agent's ready timeout
  does that).
- every other rank, `worker`: runs `ray start --block --address HEAD`, and answers `/health` 200 on its own port
  while the head still counts this many nodes, 503 before; the shard is ready once it joined.

Either child exiting ends the launcher with its status, and the supervisor's stop kills the whole group: a dead
worker's Ray node leaves the cluster, the head's vLLM loses its actors and exits, and the replica fails — never
a head serving on half its GPUs. Distributed sockets bind to the fabric address only (`--node-ip-address`).
"""

from __future__ import annotations

import argparse
import http.server
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

POLL_S = 0.5
_ACTIVE_NODE = re.compile(r"^\s*(\d+)\s+node_\S+")


def active_nodes(status_text: str) -> int | None:
    """Nodes in the `Active:` block of `ray status`; None when the text has no such block."""
    lines = status_text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Active:")
    except StopIteration:
        return None
    count = 0
    for line in lines[start + 1 :]:
        m = _ACTIVE_NODE.match(line)
        if m is None:
            break
        count += int(m.group(1))
    return count


def _count(ray: str, address: str) -> int | None:
    try:
        out = subprocess.run(
            [ray, "status", f"--address={address}"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return active_nodes(out.stdout) if out.returncode == 0 else None


def _wait_children(children: Sequence[subprocess.Popen[bytes]]) -> int:
    while True:
        for child in children:
            code = child.poll()
            if code is not None:
                for other in children:
                    if other is not child and other.poll() is None:
                        other.terminate()
                return code
        time.sleep(POLL_S)


def head(ns: argparse.Namespace, engine_argv: list[str]) -> int:
    address = f"{ns.ip}:{ns.port}"
    ray = subprocess.Popen(
        [ns.ray, "start", "--block", "--head", f"--port={ns.port}", f"--node-ip-address={ns.ip}"]
    )
    said = None
    while True:
        if ray.poll() is not None:
            print(f"llmgw ray head: `ray start --head` exited with {ray.returncode}", flush=True)
            return ray.returncode or 1
        joined = _count(ns.ray, address)
        if joined is not None and joined >= ns.nodes:
            break
        if joined != said:
            print(
                f"llmgw ray head: waiting for {ns.nodes} Ray nodes at {address}, {joined or 0} joined",
                flush=True,
            )
            said = joined
        time.sleep(POLL_S)
    print(f"llmgw ray head: all {ns.nodes} Ray nodes joined; starting the engine", flush=True)
    engine = subprocess.Popen(engine_argv)
    return _wait_children([engine, ray])


class _Health(http.server.BaseHTTPRequestHandler):
    joined = threading.Event()

    def do_GET(self) -> None:
        ok = self.path == "/health" and self.joined.is_set()
        self.send_response(200 if ok else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def worker(ns: argparse.Namespace) -> int:
    ray = subprocess.Popen(
        [ns.ray, "start", "--block", f"--address={ns.address}", f"--node-ip-address={ns.ip}"]
    )
    host, _, port = ns.health.rpartition(":")
    server = http.server.ThreadingHTTPServer((host, int(port)), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def watch() -> None:
        while ray.poll() is None:
            joined = _count(ns.ray, ns.address)
            if joined is not None and joined >= 2 and not _Health.joined.is_set():
                print(
                    f"llmgw ray worker: joined the Ray cluster at {ns.address} ({joined} nodes)", flush=True
                )
                _Health.joined.set()
            time.sleep(POLL_S)

    threading.Thread(target=watch, daemon=True).start()
    code = ray.wait()
    print(f"llmgw ray worker: `ray start` exited with {code}", flush=True)
    return code or 1


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    engine_argv: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, engine_argv = args[:cut], args[cut + 1 :]
    p = argparse.ArgumentParser(prog="python -m llmgw_agent.ray_launch")
    roles = p.add_subparsers(dest="role", required=True)
    h = roles.add_parser("head")
    h.add_argument("--ray", required=True)
    h.add_argument("--ip", required=True)
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--nodes", type=int, required=True)
    w = roles.add_parser("worker")
    w.add_argument("--ray", required=True)
    w.add_argument("--ip", required=True)
    w.add_argument("--address", required=True)
    w.add_argument("--health", required=True, help="host:port to answer /health on")
    ns = p.parse_args(args)
    if ns.role == "head":
        if not engine_argv:
            p.error("head needs the engine's command after --")
        return head(ns, engine_argv)
    return worker(ns)


if __name__ == "__main__":
    sys.exit(main())
