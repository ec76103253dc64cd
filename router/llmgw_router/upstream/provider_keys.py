"""Provider keys for a snapshot: read through the shared, confined resolver; a bad one drops one provider.

A snapshot carries tenants' allowlists and limits beside the provider models. Refusing the whole snapshot
because one provider's key file is unreadable (or its reference is refused) would leave this router on the
previous revision's policy — a revoked project still served, a lowered budget not enforced. So a provider
whose key or URL cannot be used is dropped from the table alone: its model answers 503 like any model
without an endpoint, `llmgw_router_provider_unavailable{model}` is 1, and the reason is logged once (again
only when it changes), not on every snapshot.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import Gauge

from llmgw.core.config.secret_bindings import SecretUse
from llmgw.core.config.secretrefs import SecretPolicy, SecretRefError, resolve_bound
from llmgw.core.security import forbidden_address_reason
from llmgw.core.snapshot import PublishedModel, RouterSnapshot

log = logging.getLogger("llmgw_router.upstream.provider_keys")

# Relative to the router's working directory only until the process starts: made absolute once there.
DEFAULT_SECRETS_DIR = Path(".llmgw/router/secrets")


def provider_key(
    model: PublishedModel,
    policy: SecretPolicy,
    environ: Mapping[str, str] | None = None,
    reserved: frozenset[str] = frozenset(),
) -> str | None:
    """The provider's key (None when the model declares none), only when the operator's binding map lets it
    go to the provider's host (llmgw.core.config.secret_bindings) and it is none of the `reserved` names (the
    cluster's own); ValueError with the rule or the reason."""
    provider = model.provider
    if provider is None or provider.key is None:
        return None
    try:
        return resolve_bound(SecretUse(provider.key, "provider-key", provider.url), policy, reserved, environ)
    except SecretRefError as exc:
        raise ValueError(f"provider key (spec.provider.key): {exc}") from None


@dataclass(frozen=True)
class UsableProviders:
    snapshot: RouterSnapshot  # the snapshot with every unusable provider removed from its model
    keys: dict[str, str | None]  # model -> key of its (usable) provider
    unavailable: dict[str, str]  # model -> why its provider was dropped


def usable_providers(
    snapshot: RouterSnapshot, policy: SecretPolicy, environ: Mapping[str, str] | None = None
) -> UsableProviders:
    """Split the snapshot's providers into those the router can call and those it cannot, and why."""
    keys: dict[str, str | None] = {}
    unavailable: dict[str, str] = {}
    for name, m in snapshot.models.items():
        if m.provider is None:
            continue
        if why := forbidden_address_reason(m.provider.url):
            unavailable[name] = f"provider url refused: {why}"
            continue
        try:
            keys[name] = provider_key(m, policy, environ, frozenset(snapshot.reserved_secrets))
        except ValueError as exc:
            unavailable[name] = str(exc)
    if unavailable:
        models = {
            name: m.model_copy(update={"provider": None}) if name in unavailable else m
            for name, m in snapshot.models.items()
        }
        snapshot = snapshot.model_copy(update={"models": models})
    return UsableProviders(snapshot, keys, unavailable)


@dataclass
class ProviderHealth:
    """The gauge (llmgw_router_provider_unavailable) and the log-once memory of dropped providers, kept
    across snapshots."""

    gauge: Gauge
    reported: dict[str, str] = field(default_factory=dict)

    def update(self, unavailable: Mapping[str, str]) -> None:
        for name, why in unavailable.items():
            if self.reported.get(name) != why:
                log.error("model %s: provider dropped, the model is unavailable: %s", name, why)
            self.gauge.labels(name).set(1)
        for name in set(self.reported) - set(unavailable):
            log.info("model %s: provider available again", name)
            self.gauge.remove(name)
        self.reported = dict(unavailable)
