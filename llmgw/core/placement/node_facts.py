"""What a node's own report says about the engines it can run, and where its weights cache's disk is.

Pure: the controller hands in what the agent reported and the Cluster's engine settings; placement reads the
answers from `NodeView.engine_refusals`, `disk_free_bytes` and `shared_disk`.

Unknown is not zero here either: a requirement the node did not report a fact for (an older agent sends no CPU
flags) is accepted, so a controller upgrade never empties a fleet; a fact that was reported and falls short is
a refusal in words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.core.config.models import EngineRequires, EngineSettings

__all__ = [
    "CacheDisk",
    "ConditionFact",
    "PlatformFacts",
    "cache_disk",
    "engine_refusals",
    "requires_problems",
]


@dataclass(frozen=True, slots=True)
class PlatformFacts:
    cpu_flags: frozenset[str] | None = None
    arch: str | None = None
    glibc: str | None = None
    gpu_driver: str | None = None
    cuda: str | None = None  # the CUDA version the driver supports (nvidia-smi's `CUDA Version`)


@dataclass(frozen=True, slots=True)
class ConditionFact:
    """A node condition about one engine, as the agent said it (llmgw_agent.protocol.NodeCondition)."""

    type: str
    engine: str
    message: str
    tail: tuple[str, ...] = ()


def _version_tuple(text: str) -> tuple[int, ...] | None:
    parts: list[int] = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts)


def _older(have: str, need: str) -> bool:
    a, b = _version_tuple(have), _version_tuple(need)
    return a is not None and b is not None and a < b


def requires_problems(req: EngineRequires, facts: PlatformFacts) -> list[str]:
    """What the node lacks of `req`, in words; facts it did not report are not held against it."""
    problems: list[str] = []
    if req.cpu_flags and facts.cpu_flags is not None:
        missing = [f for f in req.cpu_flags if f not in facts.cpu_flags]
        if missing:
            problems.append(f"CPU lacks {', '.join(missing)}")
    if req.arch is not None and facts.arch is not None and facts.arch != req.arch:
        problems.append(f"is {facts.arch}, needs {req.arch}")
    if req.min_glibc is not None and facts.glibc is not None and _older(facts.glibc, req.min_glibc):
        problems.append(f"has glibc {facts.glibc}, needs {req.min_glibc}")
    if req.min_gpu_driver is not None:
        if facts.gpu_driver is None:
            problems.append(f"reports no NVIDIA driver, needs {req.min_gpu_driver}")
        elif _older(facts.gpu_driver, req.min_gpu_driver):
            problems.append(f"has NVIDIA driver {facts.gpu_driver}, needs {req.min_gpu_driver}")
    if req.min_cuda is not None:
        if facts.cuda is None:
            problems.append(f"reports no CUDA version, needs {req.min_cuda}")
        elif _older(facts.cuda, req.min_cuda):
            problems.append(f"has CUDA {facts.cuda}, needs {req.min_cuda}")
    return problems


_CONDITION_WORDS = {
    "EngineInstalling": "{engine} is being installed: {message}",
    "EngineInstallFailed": "{engine} install failed: {message}",
    "EngineProbeFailed": "{engine} probe failed: {message}",
    "EngineCheckFailed": "{engine} device check failed: {message}",
}


def engine_refusals(
    engines: Mapping[str, EngineSettings],
    facts: PlatformFacts,
    conditions: Iterable[ConditionFact],
    build_refusals: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Engine -> why this node cannot run it: the build's requirements it lacks, or why no build of it is
    the node's (`build_refusals`, from placement.engine_builds; said first: installing would not help), else
    the node's own words about a failed install, probe or device check, with the last output line."""
    out: dict[str, str] = {}
    for cond in conditions:
        words = _CONDITION_WORDS.get(cond.type, "{engine}: {message}").format(
            engine=cond.engine, message=cond.message
        )
        if cond.tail:
            words += f" ({cond.tail[-1]})"
        out[cond.engine] = words
    for name, settings in engines.items():
        if build_refusals and name in build_refusals:
            out[name] = build_refusals[name]
            continue
        if settings.requires is None:
            continue
        problems = requires_problems(settings.requires, facts)
        if problems:
            out[name] = f"cannot run this {name} build: {'; '.join(problems)}"
    return out


@dataclass(frozen=True, slots=True)
class CacheDisk:
    """One filesystem an agent reported (llmgw_agent.protocol.Disk)."""

    free_bytes: int | None
    shared: bool | None
    holds_cache: bool | None
    fstype: str | None = None
    mount_source: str | None = None
    filesystem_id: str | None = None


def cache_disk(disks: Sequence[CacheDisk] | None) -> tuple[int | None, str | None]:
    """(free bytes placement charges, the shared filesystem's name or None) for a node's reported disks.

    The filesystem holding the weights cache when the agent marked it; a shared one is named by its type and
    mount source, which every node mounting it reports alike. An agent before the mark: the largest of its
    local filesystems, never a filer (a filer's free space is everyone's). Nothing reported: unknown."""
    if not disks:
        return None, None
    marked = [d for d in disks if d.holds_cache]
    if marked:
        disk = marked[0]
        if disk.shared:
            name = f"{disk.fstype or 'shared'}:{disk.mount_source or disk.filesystem_id or '?'}"
            return disk.free_bytes, name
        return disk.free_bytes, None
    local = [d.free_bytes for d in disks if d.shared is not True and d.free_bytes is not None]
    return (max(local) if local else None), None
