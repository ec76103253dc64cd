"""Small builders for nodes, models and replicas, shared by the placement, reconcile and plan tests."""

from __future__ import annotations

import hashlib
from typing import Any

from llmgw.core.config.models import ModelSpec, Profile
from llmgw.core.fleet.views import GIB, GpuView, ModelView, NodeView, ReplicaView, ShardView


def gpu_node(
    name: str,
    gpus: int = 8,
    gpu_class: str = "h100-80g",
    allocated: tuple[int, ...] = (),
    **kw: Any,
) -> NodeView:
    kw.setdefault("cpu_cores", 64)
    kw.setdefault("memory_bytes", 512 * GIB)
    kw.setdefault("disk_free_bytes", 2000 * GIB)
    kw.setdefault("engines", {"vllm": "0.10.1", "llamacpp": "b11434", "sglang": "0.4.6"})
    return NodeView(
        name=name,
        gpus=tuple(GpuView(i, gpu_class, 80 * GIB, i in allocated) for i in range(gpus)),
        **kw,
    )


def cpu_node(name: str, cores: int | None = 16, memory_gb: float | None = 32, **kw: Any) -> NodeView:
    kw.setdefault("disk_free_bytes", 500 * GIB)
    kw.setdefault("engines", {"llamacpp": "b11434"})
    kw.setdefault("gpus", ())
    return NodeView(
        name=name,
        cpu_cores=cores,
        memory_bytes=None if memory_gb is None else int(memory_gb * GIB),
        **kw,
    )


def gpu_profile(name: str = "gpu", gpus: int = 4, gpu_class: str = "h100-80g", **kw: Any) -> Profile:
    kw.setdefault("engine", "vllm")
    return Profile(name=name, gpu_class=gpu_class, gpus=gpus, tp=gpus * kw.get("nodes", 1), **kw)


def cpu_profile(name: str = "cpu", cores: int = 4, memory_gb: float | None = 8, **kw: Any) -> Profile:
    kw.setdefault("engine", "llamacpp")
    return Profile(name=name, cpu_cores=cores, min_memory_gb=memory_gb, **kw)


def entry(*profiles: Profile, min: int = 1, max: int | None = None, **spec: Any) -> ModelView:
    scaling = dict(spec.pop("scaling", {}))
    scaling.setdefault("min", min)
    scaling.setdefault("max", max if max is not None else builtins_max(min, 1))
    model = ModelSpec.model_validate(
        {"context_length": 4096, "scaling": scaling, "profiles": [p.model_dump() for p in profiles], **spec}
    )
    return ModelView(model, {p.name: fingerprint(p) for p in profiles})


def fingerprint(profile: Profile) -> str:
    """Stands in for catalog.profile_fingerprint: any change to the profile changes it."""
    return hashlib.sha256(profile.model_dump_json().encode()).hexdigest()[:12]


def builtins_max(a: int, b: int) -> int:
    return a if a > b else b


def replica(
    rid: str,
    model: str,
    profile: str,
    *shards: tuple[str, tuple[int, ...]],
    state: str = "ready",
    shard_state: str = "ready",
    fingerprint: str | None = None,
    **kw: Any,
) -> ReplicaView:
    return ReplicaView(
        id=rid,
        model=model,
        profile=profile,
        fingerprint=fingerprint if fingerprint is not None else "",
        shards=tuple(ShardView(n, rank, g, shard_state) for rank, (n, g) in enumerate(shards)),  # type: ignore[arg-type]
        state=state,  # type: ignore[arg-type]
        **kw,
    )
