"""Which build of each engine a node runs (docs/engines.md, Builds per node). Pure.

The Cluster declares an engine version's builds in order of preference (a CUDA 13, a CUDA 12.9, a CPU build);
a node runs the first whose `requires` it meets: its NVIDIA driver, the CUDA version that driver supports, its
CPU flags, architecture and glibc. A `cuda` build needs a node that reports an NVIDIA driver. `engine_overrides`
decide first, the most specific match winning (node, then labels, then GPU class; then the first listed): a
named build (which the node must still be able to run) or `disabled`. What a node did not report is not held
against it (as `requires_problems`), except the driver a CUDA build needs.

The same choice feeds the engine order the node is sent and the refusal placement reads, so a node is never
told to install one build while placement counts it for another.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.config.models import EngineBuild, EngineBuildCheck, EngineOverride, EngineSettings
from llmgw.core.config.specs.engine_build_spec import AVX2_ENGINES
from llmgw.core.placement.node_facts import PlatformFacts, requires_problems

__all__ = [
    "AVX2_ENGINES",
    "AVX2_WARNING",
    "BuildChoice",
    "BuildNode",
    "choose_builds",
    "default_check",
    "pick_build",
]

AVX2_WARNING = (
    "CPU lacks AVX2: CPU builds of llama.cpp and vLLM run several times slower on it, or not at all "
    "(a build made for AVX2 stops with `Illegal instruction`)"
)


@dataclass(frozen=True, slots=True)
class BuildNode:
    """What a node is, for choosing its builds."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_classes: frozenset[str] = frozenset()
    facts: PlatformFacts = field(default_factory=PlatformFacts)


@dataclass(frozen=True, slots=True)
class BuildChoice:
    """The build a node runs (None: the engine declares no builds, or the node runs none), or why none."""

    build: EngineBuild | None = None
    refusal: str | None = None
    warning: str | None = None  # it may run it, but should be told something (a CPU without AVX2)


def _override(engine: str, overrides: Sequence[EngineOverride], node: BuildNode) -> EngineOverride | None:
    hits = [
        o
        for o in overrides
        if o.engine == engine and o.matches(node.name, dict(node.labels), node.gpu_classes)
    ]
    return max(hits, key=lambda o: o.specificity(), default=None)  # max keeps the first of equals


def _by(o: EngineOverride) -> str:
    if o.node is not None:
        return f"node {o.node}"
    if o.labels:
        return "labels " + ", ".join(f"{k}={v}" for k, v in sorted(o.labels.items()))
    return f"gpu_class {o.gpu_class}"


def build_problems(build: EngineBuild, facts: PlatformFacts) -> list[str]:
    problems = requires_problems(build.requires, facts) if build.requires is not None else []
    needs_driver = build.requires is not None and build.requires.min_gpu_driver is not None
    if build.accelerator == "cuda" and facts.gpu_driver is None and not needs_driver:
        problems.append("reports no NVIDIA driver, which a cuda build needs")
    return problems


def _avx2_warning(build: EngineBuild | None, facts: PlatformFacts) -> str | None:
    cpu = build is None or build.accelerator == "cpu"
    x86 = facts.arch in (None, "x86_64", "amd64")
    lacking = facts.cpu_flags is not None and "avx2" not in facts.cpu_flags and "asimd" not in facts.cpu_flags
    return AVX2_WARNING if cpu and x86 and lacking else None


def pick_build(
    engine: str, settings: EngineSettings, overrides: Sequence[EngineOverride], node: BuildNode
) -> BuildChoice:
    override = _override(engine, overrides, node)
    if override is not None and override.disabled:
        return BuildChoice(refusal=f"{engine} is disabled here by engine_overrides ({_by(override)})")
    if not settings.builds:
        return BuildChoice(warning=_avx2_warning(None, node.facts) if engine in AVX2_ENGINES else None)
    if override is not None:
        build = next((b for b in settings.builds if b.name == override.build), None)
        if build is None:  # validate refuses it first; a controller never trusts that alone
            said = f"engine_overrides ({_by(override)}) names {engine} build {override.build}"
            return BuildChoice(refusal=f"{said}, which the Cluster does not declare")
        problems = build_problems(build, node.facts)
        if problems:
            said = f"engine_overrides ({_by(override)}) gives it {engine} build {build.name}"
            return BuildChoice(refusal=f"{said}, which it cannot run: {'; '.join(problems)}")
        return BuildChoice(build, warning=_avx2_warning(build, node.facts))
    unfit: list[str] = []
    for build in settings.builds:
        problems = build_problems(build, node.facts)
        if not problems:
            return BuildChoice(build, warning=_avx2_warning(build, node.facts))
        unfit.append(f"{build.name}: {'; '.join(problems)}")
    return BuildChoice(refusal=f"no build of {engine} fits this node ({' | '.join(unfit)})")


def choose_builds(
    engines: Mapping[str, EngineSettings], overrides: Sequence[EngineOverride], node: BuildNode
) -> dict[str, BuildChoice]:
    """Each engine the Cluster declares -> the node's choice; an AVX2 engine it does not declare (the agent's
    own) -> the warning its CPU build earns here, if any."""
    out = {name: pick_build(name, s, overrides, node) for name, s in sorted(engines.items())}
    for engine in sorted(AVX2_ENGINES - set(out)):
        warning = _avx2_warning(None, node.facts)
        if warning is not None:
            out[engine] = BuildChoice(warning=warning)
    return out


# The device checks an install passes when its build names none: a CUDA build must see and use a GPU.
_TORCH_ON_CUDA = (
    "import torch; x = torch.ones(4, device='cuda'); "
    "print('computed', float((x * 2).sum()), 'on', torch.cuda.get_device_name(0))"
)


def default_check(engine: str, build: EngineBuild) -> EngineBuildCheck | None:
    """The build's own check, else the engine's default for its accelerator (None: the probe is the check)."""
    if build.check is not None:
        return build.check
    if build.accelerator != "cuda":
        return None
    if engine == "llamacpp":  # llama-server lists the devices its backends found (b4000+)
        return EngineBuildCheck(argv=["{binary}", "--list-devices"], expect=r"(?m)^\s+CUDA\d+:")
    if engine in ("vllm", "sglang"):  # their executable is a python: compute on the GPU with torch
        return EngineBuildCheck(argv=["{binary}", "-c", _TORCH_ON_CUDA], expect=r"computed 8\.0 on ")
    return None
