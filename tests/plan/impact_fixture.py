"""A week of recorded traffic and a pull request that meets it: what the Impact golden tests plan against.

The applied revision (`write_repo(..., applied=True)`): organization acme > team research (tpm 100k) >
projects playground (may use gemma and sim-chat) and prod (every model); gemma priced 0.10/0.20 per million;
sim-chat scaled 1..3 with a measured capacity of 8 per replica; sim-slots (max 2, 4 slots, never measured).

The pull request (`applied=False`):
- playground's models no longer list gemma (it sent 12,400 requests to it in the week);
- research's tpm goes to 50k (its busiest minute: 81 requests of 1,000 tokens from prod, plus playground's);
- prod gets an rpm of 200 (its busiest minute: 81 requests: within it);
- sim-chat's max drops to 1 (its peak concurrency: 19, the burst's);
- sim-slots' max drops to 1 (its peak: 3 at once; 4 slots assumed: within it);
- gemma's prices go to 0.50/1.00 per million.

A project `legacy` used a model `retired` that the applied revision no longer has: refused before this
plan, so not its loss.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.core.fleet.views import LiveNode, LiveReplica, LiveShard, LiveState, model_views
from llmgw.core.plan import catalog_documents
from llmgw.store import Store, UsageRecord
from llmgw.store.queries.capacity import CapacityRecord

NOW = 1_790_000_040.0  # the end of the window; a whole minute (60 * 29_833_334)
WEEK = 7 * 86400.0
BURST_AT = NOW - 2 * 86400 - 60.0  # a minute's start, two days ago

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: impact-test}
spec:
  controller: {address: "127.0.0.1:7070"}
---
apiVersion: llmgw/v1
kind: Node
metadata: {name: cpu-1}
spec: {address: 10.0.0.1}
"""


def _tenants(applied: bool) -> str:
    playground = "[gemma, sim-chat]" if applied else "[sim-chat]"
    tpm = 100000 if applied else 50000
    prod_limits = "" if applied else "\n  limits: {rpm: 200}"
    return f"""\
apiVersion: llmgw/v1
kind: Organization
metadata: {{name: acme}}
spec: {{}}
---
apiVersion: llmgw/v1
kind: Team
metadata: {{name: research}}
spec:
  organization: acme
  limits: {{tpm: {tpm}}}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: playground}}
spec:
  team: research
  models: {playground}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: prod}}
spec:
  team: research{prod_limits}
---
apiVersion: llmgw/v1
kind: Project
metadata: {{name: legacy}}
spec:
  team: research
"""


def _model(name: str, max_: int, extra: str = "", slots: str = "", args: str = "max_concurrency: 8") -> str:
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  scaling: {{min: 1, max: {max_}}}{extra}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: 1{slots}, args: {{{args}}}}}
"""


def write_repo(root: Path, *, applied: bool) -> Path:
    prices = "\n  prices: {input_per_million: %s, output_per_million: %s}" % (
        ("0.1", "0.2") if applied else ("0.5", "1.0")
    )
    files = {
        "cluster.yaml": CLUSTER,
        "tenants.yaml": _tenants(applied),
        "models/gemma.yaml": _model("gemma", 1, prices),
        "models/sim-chat.yaml": _model("sim-chat", 3 if applied else 1),
        "models/sim-slots.yaml": _model("sim-slots", 2 if applied else 1, slots=", slots: 4", args=""),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def live_state(applied_repo: Path) -> LiveState:
    """The fleet running the applied revision: one ready replica of each model on cpu-1."""
    loaded = load_repo(applied_repo)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    catalog = loaded.repo.catalog
    views = model_views(catalog)
    replicas = []
    for name, view in sorted(views.items()):
        for i in range(view.spec.scaling.min):
            replicas.append(
                LiveReplica(
                    id=f"{name}-{i + 1}",
                    model=name,
                    profile="sim",
                    fingerprint=view.fingerprints["sim"],
                    shards=[LiveShard(node="cpu-1", state="ready")],
                    state="ready",
                )
            )
    return LiveState(
        revision="a99l1ed0000",
        taken_at=NOW,
        nodes=[LiveNode(name="cpu-1", cpu_cores=16, memory_bytes=64 << 30, gpus=[], engines={"sim": None})],
        replicas=replicas,
        models={name: view.spec for name, view in views.items()},
        documents=catalog_documents(catalog),
    )


def _row(
    at: float, project: str, model: str, tin: int, tout: int, latency_s: float, status: int = 200
) -> UsageRecord:
    price_in, price_out = (0.1, 0.2) if model == "gemma" else (0.0, 0.0)
    return UsageRecord(
        time=at,
        request_id=f"req-{project}-{model}-{at:.3f}",
        project=project,
        team="research",
        org="acme",
        model=model,
        status=status,
        tokens_in=tin,
        tokens_out=tout,
        cost=(tin * price_in + tout * price_out) / 1e6,
        latency_ms=latency_s * 1000,
        id=f"u-{project}-{model}-{at:.3f}",
    )


def recorded_week() -> list[UsageRecord]:
    """The week the store recorded, oldest first."""
    rows: list[UsageRecord] = []
    start = NOW - WEEK
    step = WEEK / 12_400
    rows += [
        _row(start + (i + 0.5) * step, "playground", "gemma", 200, 50, 0.5, 500 if i % 1000 == 0 else 200)
        for i in range(12_400)
    ]
    steady = (start + 30 + 60 * i for i in range(10_080))  # one a minute, but none in the burst's minute
    rows += [_row(at, "prod", "sim-chat", 80, 20, 2.0) for at in steady if not BURST_AT <= at < BURST_AT + 60]
    # The burst: 81 requests of 1,000 tokens in one minute, one every 0.5 s, each 9.5 s long: 19 at once.
    rows += [_row(BURST_AT + 0.5 * k + 0.25, "prod", "sim-chat", 800, 200, 9.5) for k in range(81)]
    # sim-slots: three overlapping requests once; one refused by a limit (429: it held no slot).
    rows += [_row(NOW - 3600 + k, "prod", "sim-slots", 10, 10, 5.0) for k in range(3)]
    rows.append(_row(NOW - 3600 + 1.5, "prod", "sim-slots", 10, 0, 0.001, status=429))
    rows.append(_row(NOW - 86400, "legacy", "retired", 10, 10, 1.0))
    rows.append(_row(NOW - WEEK - 10, "playground", "gemma", 10, 10, 1.0))  # before the window
    return sorted(rows, key=lambda r: r.time)


async def record(store: Store) -> None:
    rows = recorded_week()
    for i in range(0, len(rows), 2000):
        await store.insert_usage(rows[i : i + 2000])
    await store.save_capacity(
        CapacityRecord(
            model="sim-chat",
            profile="sim",
            gpu_class="",
            engine="sim",
            measured_at=NOW - 86400,
            objective_ms=500.0,
            concurrency=8,
            tokens_per_s=400.0,
            prefill_ms_per_token=None,
            decode_ms_per_token=None,
            load_s=1.0,
        )
    )
