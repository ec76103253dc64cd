"""Whole-repo checks of Adapter documents: the base is a model that can carry one, the name is free, the
projects exist. Pure; run by semantic.check beside the other stages."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from llmgw.core.config.models import LORA_ENGINES, Adapter, Model, Project
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_adapters"]

# (index, path, message, hint) -> None: checker.Checker.add
Add = Callable[..., None]


def check_adapters(documents: Sequence[object], add: Add) -> None:
    models = {d.metadata.name: d for d in documents if isinstance(d, Model)}
    aliases = {a for d in models.values() for a in d.spec.aliases}
    projects = {d.metadata.name for d in documents if isinstance(d, Project)}
    for index, doc in enumerate(documents):
        if not isinstance(doc, Adapter):
            continue
        name, spec = doc.metadata.name, doc.spec
        if name in models or name in aliases:
            add(
                index,
                ("metadata", "name"),
                f"adapter `{name}` has the name of a model or alias; clients ask for an adapter by its name",
                "give the adapter a name of its own",
            )
        base = models.get(spec.base)
        if base is None:
            hint = did_you_mean(spec.base, models) or "name a Model document (its name, not an alias)"
            add(index, ("spec", "base"), f"base model `{spec.base}` is not defined", hint)
        else:
            engines = sorted({p.engine for p in base.spec.profiles})
            if base.spec.provider is not None or not set(engines) & LORA_ENGINES:
                add(
                    index,
                    ("spec", "base"),
                    f"base model `{spec.base}` runs on {', '.join(engines) or 'no engine (a provider)'}, "
                    "which carries no LoRA adapter",
                    f"give it a profile on {' or '.join(sorted(LORA_ENGINES))}",
                )
        for pos, project in enumerate(spec.projects or ()):
            if project not in projects:
                add(
                    index,
                    ("spec", "projects", pos),
                    f"Project `{project}` is not defined",
                    did_you_mean(project, projects) or f"add a Project document named `{project}`",
                )
