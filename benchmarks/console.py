"""The web console's page weight and speed at fleet size: each page's server time and transfer size.

One controller in this process follows a repo of `--models` sim models (one replica each, min = max = 1);
`--nodes` simulated nodes (four GPUs, disks, engines, labels, two fabrics) and one ready replica per model
are put into its views directly, as an agent's registration and reports would, so the pages show a full
fleet without a thousand processes. The reconciler sees each model at its target and starts nothing.

Each page is fetched `--repeat` times over loopback with a logged-in session (an admin-scope session for
most pages; a plan-scope one for the node and replica pages, whose log tails would ask agents that are not
there). Printed per page: the median time from request to the last byte (over loopback, in this process:
an upper bound of the server's time) and the body size. Targets: under 200 ms and under 300 KB per page.

The last line is machine-readable:

  console: pages=N worst_ms=X worst_kb=X over_time=N over_size=N

Run: .venv/bin/python benchmarks/console.py [--nodes 1000] [--models 500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from llmgw_agent.protocol import Disk, EngineInstall, Gpu, Inventory, ShardStatus

from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.parts.hub import NodeLink
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.controller.parts.state import ReplicaRec, ShardPlacement

TARGET_MS = 200.0
TARGET_KB = 300.0
PLAN_TOKEN = "bench-plan-token"


class _OpenSocket:
    """Stands for an agent's WebSocket: open, and never sent anything (no page here commands an agent)."""

    closed = False


def write_repo(root: Path, models: int) -> None:
    (root / "models").mkdir(parents=True)
    (root / "cluster.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Cluster\nmetadata: {name: bench}\nspec:\n"
        "  controller: {heartbeat_interval: 1h, unreachable_after: 2h, lost_after: 3h}\n"
    )
    docs = [
        f"apiVersion: llmgw/v1\nkind: Model\nmetadata: {{name: m{i:04d}}}\nspec:\n  context_length: 4096\n"
        f"  scaling: {{min: 1, max: 1}}\n  profiles:\n    - {{name: sim, engine: sim, cpu_cores: 1}}\n"
        for i in range(models)
    ]
    (root / "models" / "all.yaml").write_text("---\n".join(docs))
    (root / "tenants.yaml").write_text(
        "apiVersion: llmgw/v1\nkind: Organization\nmetadata: {name: acme}\nspec: {}\n---\n"
        "apiVersion: llmgw/v1\nkind: Project\nmetadata: {name: bench}\nspec: {organization: acme}\n"
    )


def fill_fleet(running: RunningController, nodes: int) -> None:
    """Nodes and one ready replica per model, in one step (the reconciler sees both at once)."""
    c = running.controller
    d = c.desired
    assert d is not None
    now, wall = c.clock(), c.wall()
    links: dict[str, NodeLink] = {}
    for i in range(nodes):
        inventory = Inventory(
            cpu_cores=64,
            memory_bytes=512 << 30,
            gpus=[
                Gpu(index=g, gpu_class="h100-80g" if i % 3 else "l40s-48g", memory_bytes=80 << 30)
                for g in range(4)
            ],
            engines={"sim": EngineInstall(version="1"), "vllm": EngineInstall(version="0.9.1")},
            disks=[Disk(path="/var/lib/llmgw", total_bytes=2 << 40, free_bytes=1 << 40, fstype="ext4")],
            labels={"zone": f"z{i % 4}", "rack": f"r{i % 40}"},
        )
        name = f"node-{i:04d}"
        links[name] = NodeLink(
            name=name,
            inventory=inventory,
            agent_version="bench",
            address="bench",
            connected_at=now,
            last_seen=now,
            ws=_OpenSocket(),
        )  # type: ignore[arg-type]
    for i, model in enumerate(sorted(d.models)):
        node = f"node-{i % nodes:04d}"
        profile = d.models[model].profiles[0]
        rid = f"{model}-r{i}"
        c.replicas[rid] = ReplicaRec(
            id=rid,
            model=model,
            profile=profile.name,
            fingerprint=profile.fingerprint,
            created_at=wall,
            shards=(ShardPlacement(node, 0, (i % 4,)),),
            ready_since=now,
        )
        links[node].shards[f"{rid}-0"] = ShardStatus(
            replica_id=rid,
            model=model,
            engine="sim",
            state="ready",
            host="127.0.0.1",
            port=20000 + i,
            gpus=[i % 4],
            fingerprint=profile.fingerprint,
        )
    c.agents.nodes.update(links)


async def session_cookie(http: aiohttp.ClientSession, base: str, token: str) -> None:
    async with http.get(base + "/ui/login") as r:
        found = re.search(r'name="csrf" value="([^"]+)"', await r.text())
        assert found is not None
    async with http.post(base + "/ui/login", data={"csrf": found.group(1), "token": token}) as r:
        assert r.status == 200, f"login: {r.status}"


async def measure(http: aiohttp.ClientSession, url: str, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        async with http.get(url) as r:
            body = await r.read()
            assert r.status == 200, f"{url}: {r.status} {body[:300]!r}"
        times.append((time.perf_counter() - t0) * 1000)
        size = len(body)
    return statistics.median(times), size


async def run(nodes: int, models: int, repeat: int) -> int:
    with tempfile.TemporaryDirectory(prefix="llmgw-console-bench-") as tmp_s:
        tmp = Path(tmp_s)
        write_repo(tmp / "repo", models)
        (tmp / "token").write_text("bench-admin-token\n")
        digest = hashlib.sha256(PLAN_TOKEN.encode()).hexdigest()
        (tmp / "tokens.yaml").write_text(f"bench-plan: {{scope: plan, sha256: {digest}}}\n")
        settings = ControllerOptions(
            repo=str(tmp / "repo"),
            source="directory",
            store=f"sqlite:///{tmp / 'c.db'}",
            listen="127.0.0.1:0",
            metrics_listen=None,
            admin_token_file=tmp / "token",
            admin_tokens_file=tmp / "tokens.yaml",
            state_dir=tmp / "state",
            settle_s=0.0,
            dir_poll_s=0.5,
        )
        running = await start_controller(settings)
        try:
            deadline = time.monotonic() + 60
            while running.controller.desired is None:
                if time.monotonic() > deadline:
                    print("the controller applied nothing in 60 s", file=sys.stderr)
                    return 1
                await asyncio.sleep(0.1)
            fill_fleet(running, nodes)
            return await _pages(running, nodes, models, repeat)
        finally:
            await running.stop()


async def _pages(running: RunningController, nodes: int, models: int, repeat: int) -> int:
    base = running.url
    admin_pages = [
        "/ui/",
        "/ui/nodes",
        "/ui/nodes?gpu_class=l40s-48g&label=zone%3Dz1",
        "/ui/nodes?page=20",
        "/ui/models",
        "/ui/models?q=m01",
        "/ui/plan",
        "/ui/tenants",
        "/ui/events",
        "/ui/chat",
    ]
    plan_pages = ["/ui/nodes/node-0001", f"/ui/replicas/{next(iter(sorted(running.controller.replicas)))}"]
    rows: list[tuple[str, float, int]] = []
    for token, paths in (("bench-admin-token", admin_pages), (PLAN_TOKEN, plan_pages)):
        jar = aiohttp.CookieJar(unsafe=True)  # the controller is an IP address
        async with aiohttp.ClientSession(cookie_jar=jar) as http:
            await session_cookie(http, base, token)
            for path in paths:
                ms, size = await measure(http, base + path, repeat)
                rows.append((path, ms, size))
    print(
        f"console pages: {nodes} nodes, {models} models, {len(running.controller.replicas)} replicas; "
        f"median of {repeat} fetch(es) each"
    )
    print(f"{'page':<52} {'ms':>8} {'KB':>8}")
    for path, ms, size in rows:
        flag = " over" if ms > TARGET_MS or size / 1024 > TARGET_KB else ""
        print(f"{path:<52} {ms:8.1f} {size / 1024:8.1f}{flag}")
    worst_ms = max(ms for _, ms, _ in rows)
    worst_kb = max(size for _, _, size in rows) / 1024
    over_time = sum(1 for _, ms, _ in rows if ms > TARGET_MS)
    over_size = sum(1 for _, _, size in rows if size / 1024 > TARGET_KB)
    print(
        f"console: pages={len(rows)} worst_ms={worst_ms:.1f} worst_kb={worst_kb:.1f} "
        f"over_time={over_time} over_size={over_size}"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--models", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    return asyncio.run(run(args.nodes, args.models, args.repeat))


if __name__ == "__main__":
    sys.exit(main())
