"""Whole-repo checks of disaggregated models (called by `semantic.check`):

- `disaggregation.prefill` and `.decode` name two other models (by name or alias), neither disaggregated
  itself;
- every profile of the prefill model has `role: prefill`, every one of the decode model `role: decode`, and on
  an engine that speaks vLLM's P/D protocol (a role elsewhere would never be asked to keep or take a KV cache);
- a profile with a prefill or decode role belongs to a model some disaggregated model names for that role
  (else its replicas would run and never be sent a request in the role they were started for);
- the disaggregated model's own profiles are plain (`role: both`): they serve when a decode fails.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.core.config.disaggregation import PD_ENGINES
from llmgw.core.config.errors import IssueAdder
from llmgw.core.config.models import Model
from llmgw.core.config.validation import did_you_mean

__all__ = ["check_disaggregation"]


def check_disaggregation(documents: Sequence[object], add: IssueAdder) -> None:
    models: dict[str, Model] = {}  # name or alias -> model
    for doc in documents:
        if isinstance(doc, Model):
            models[doc.metadata.name] = doc
            models.update({alias: doc for alias in doc.spec.aliases})
    paired: dict[str, str] = {}  # pool model's name -> the role a disaggregated model gives it
    for index, doc in enumerate(documents):
        if isinstance(doc, Model) and doc.spec.disaggregation is not None:
            _pairing(doc, index, models, paired, add)
    for index, doc in enumerate(documents):
        if isinstance(doc, Model):
            _roles(doc, index, paired, add)


def _pairing(
    doc: Model, index: int, models: dict[str, Model], paired: dict[str, str], add: IssueAdder
) -> None:
    pd = doc.spec.disaggregation
    assert pd is not None
    for role, named in (("prefill", pd.prefill), ("decode", pd.decode)):
        path = ("spec", "disaggregation", role)
        target = models.get(named)
        if target is None:
            hint = did_you_mean(named, models) or f"name the model whose profiles have `role: {role}`"
            add(index, path, f"{role} pool `{named}` is not a model or alias", hint)
            continue
        name = target.metadata.name
        if name == doc.metadata.name:
            add(
                index,
                path,
                f"{role} pool `{named}` is this model itself",
                "name a model of its own for the pool",
            )
        elif target.spec.disaggregation is not None:
            add(
                index,
                path,
                f"{role} pool `{named}` is disaggregated itself",
                "name a model of plain pool replicas",
            )
        elif paired.get(name, role) != role:
            add(
                index,
                path,
                f"`{named}` is named as both a prefill and a decode pool",
                "give each role its model",
            )
        else:
            paired[name] = role
    if models.get(pd.prefill) is not None and models.get(pd.prefill) is models.get(pd.decode):
        add(
            index,
            ("spec", "disaggregation"),
            "prefill and decode name the same model",
            "give each role its model",
        )


def _roles(doc: Model, index: int, paired: dict[str, str], add: IssueAdder) -> None:
    pool_role = paired.get(doc.metadata.name)
    for pos, profile in enumerate(doc.spec.profiles):
        path = ("spec", "profiles", pos, "role")
        if pool_role is not None and profile.role != pool_role:
            add(
                index,
                path,
                f"profile `{profile.name}` has role {profile.role} in a model serving as a {pool_role} pool",
                f"set `role: {pool_role}`",
            )
        elif pool_role is None and profile.role != "both":
            why = (
                "a disaggregated model's own replicas are its plain fallback"
                if doc.spec.disaggregation is not None
                else "no model's `disaggregation` names this model as its " + profile.role + " pool"
            )
            add(
                index,
                path,
                f"profile `{profile.name}` has role {profile.role}: {why}",
                "set `role: both` or leave it out",
            )
        if profile.role != "both" and profile.engine not in PD_ENGINES:
            engines = ", ".join(sorted(PD_ENGINES))
            add(
                index,
                ("spec", "profiles", pos, "engine"),
                f"engine {profile.engine} does not speak vLLM's prefill/decode protocol (`kv_transfer_params`)",
                f"use one of: {engines}",
            )
