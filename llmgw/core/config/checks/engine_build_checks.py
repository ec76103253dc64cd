"""Whole-repo checks of the Cluster's engine builds and `engine_overrides`: an override names an engine the
Cluster sets up and a build it declares; a CPU build that does not ask for AVX2 is warned about, since a node
without it runs the build several times slower or not at all. Pure; run by semantic.check."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.core.config.models import Cluster
from llmgw.core.config.specs.engine_build_spec import AVX2_ENGINES

__all__ = ["check_engine_builds"]

# (index, path, message, hint, warning=...) -> None: checker.Checker.add
Add = Callable[..., None]


def check_engine_builds(documents: Sequence[object], add: Add) -> None:
    for index, doc in enumerate(documents):
        if not isinstance(doc, Cluster):
            continue
        engines = doc.spec.engines
        for pos, override in enumerate(doc.spec.engine_overrides):
            path = ("spec", "engine_overrides", pos)
            settings = engines.get(override.engine)
            if settings is None:
                what = f"engine {override.engine} has no settings in `spec.engines`"
                add(
                    index,
                    (*path, "engine"),
                    what,
                    f"add `spec.engines.{override.engine}`, or remove the override",
                )
                continue
            names = [b.name for b in settings.builds or []]
            if override.build is not None and override.build not in names:
                declared = ", ".join(names) if names else "none (it has no `builds`)"
                what = f"{override.engine} declares no build `{override.build}`"
                add(index, (*path, "build"), what, f"name one of its builds: {declared}")
        for engine, settings in sorted(engines.items()):
            if engine not in AVX2_ENGINES:
                continue
            for pos, build in enumerate(settings.builds or []):
                req = build.requires
                if build.accelerator != "cpu" or (req is not None and req.arch not in (None, "x86_64")):
                    continue
                if req is None or "avx2" not in req.cpu_flags:
                    add(
                        index,
                        ("spec", "engines", engine, "builds", pos),
                        f"{engine} build `{build.name}` runs on CPUs and does not require avx2: a node whose "
                        "CPU lacks AVX2 would be given it and run it several times slower, or stop with "
                        "`Illegal instruction`",
                        "add `requires: {cpu_flags: [avx2]}` (with a build for older CPUs after it, if such "
                        "nodes must serve)",
                        warning=True,
                    )
