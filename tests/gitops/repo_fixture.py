"""A small cluster repo and a saved live state made for it: what the golden-free CLI tests plan against.

Two nodes (`cpu-1` with 4 cores, `cpu-2` with 2); models:
- `sim-new`: new in the repo, one replica to start;
- `sim-old`: running with a profile the repo has since changed, and rollout.on_change: restart: restarted;
- `huge`: needs 64 cores, which no node has: cannot be placed, each node saying why;
- `gone` is running but no longer in the repo: stopped.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.core.fleet.views import LiveNode, LiveReplica, LiveShard, LiveState, model_views
from llmgw.core.plan import catalog_documents

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: gitops-test}
spec:
  controller: {address: "127.0.0.1:%(port)d"}
"""

NODES = """\
apiVersion: llmgw/v1
kind: Node
metadata: {name: cpu-1}
spec: {address: 10.0.0.1}
---
apiVersion: llmgw/v1
kind: Node
metadata: {name: cpu-2}
spec: {address: 10.0.0.2}
"""


def sim_model(name: str, cores: int = 1, decode_ms: int = 1, restart: bool = False, min_: int = 1) -> str:
    extra = "\n  rollout: {on_change: restart}" if restart else ""
    idle = ", idle_timeout: 10m" if min_ == 0 else ""
    return f"""\
apiVersion: llmgw/v1
kind: Model
metadata: {{name: {name}}}
spec:
  context_length: 4096
  scaling: {{min: {min_}, max: {max(min_, 1)}{idle}}}{extra}
  profiles:
    - {{name: sim, engine: sim, cpu_cores: {cores}, args: {{decode_ms_per_token: {decode_ms}}}}}
"""


def write_repo(root: Path, port: int = 7070) -> Path:
    files = {
        "cluster.yaml": CLUSTER % {"port": port},
        "nodes.yaml": NODES,
        "models/sim-new.yaml": sim_model("sim-new"),
        "models/sim-old.yaml": sim_model("sim-old", decode_ms=2, restart=True),
        "models/huge.yaml": sim_model("huge", cores=64),
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def live_state(root: Path) -> LiveState:
    """The fleet as a controller would report it, against the repo at `root`."""
    loaded = load_repo(root)
    assert loaded.repo is not None, [str(e) for e in loaded.errors]
    views = model_views(loaded.repo.catalog)
    previous = {
        "sim-old": views["sim-old"].spec,  # the repo's model, but its replica runs an older profile
        "huge": views["huge"].spec,
        "gone": views["sim-new"].spec,
    }
    return LiveState(
        revision="0ld0ld0ld0ld",
        taken_at=1_780_000_000.0,
        nodes=[
            LiveNode(name="cpu-1", cpu_cores=4, memory_bytes=8 << 30, gpus=[], engines={"sim": None}),
            LiveNode(name="cpu-2", cpu_cores=2, memory_bytes=8 << 30, gpus=[], engines={"sim": None}),
        ],
        replicas=[
            LiveReplica(
                id="sim-old-1",
                model="sim-old",
                profile="sim",
                fingerprint="an-older-profile",
                shards=[LiveShard(node="cpu-1", state="ready")],
                state="ready",
            ),
            LiveReplica(
                id="gone-1",
                model="gone",
                profile="sim",
                fingerprint=views["sim-new"].fingerprints["sim"],
                shards=[LiveShard(node="cpu-2", state="ready")],
                state="ready",
            ),
        ],
        models=previous,
        # Cluster and nodes as the repo declares them: the plan's changes are the models' and replicas'.
        documents=catalog_documents(loaded.repo.catalog),
    )
