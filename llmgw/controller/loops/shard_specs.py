"""What an agent is told to start: each shard's spec (engine, profile, weights as the node fetches them, adapters,
the multi-node rendezvous), built from what a start reads of the controller, taken once (`StartInputs`).

A held model (its canary failed) starts from its stable model, not the revision's (llmgw.controller.loops.canary).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmgw_agent import mig, repo_rules
from llmgw_agent.protocol import KvEventsRequest, Rendezvous, ShardAdapter, ShardSpec, WeightSource

from llmgw.adapters.secrets import read_bound_secret
from llmgw.controller.parts.desired import Desired
from llmgw.controller.parts.hub import NodeLink
from llmgw.core.config.models import LORA_ENGINES, Source
from llmgw.core.config.secret_bindings import source_use
from llmgw.core.config.secretrefs import SecretPolicy
from llmgw.core.desired.catalog import ModelEntry
from llmgw.core.fleet import distributed
from llmgw.core.fleet.views import ModelView
from llmgw.core.placement import Placement, ShardPlacement
from llmgw.core.weights.fetch_plan import weight_source
from llmgw.core.weights.manifest import ManifestFile

__all__ = ["StartInputs"]


@dataclass(frozen=True, slots=True)
class StartInputs:
    """What starting a replica reads: the applied revision, the held models' stable ones, the agents' links
    (the addresses they connected from) and where the repo's secret references are read."""

    desired: Desired
    held: Mapping[str, tuple[ModelEntry, ModelView]]
    links: Mapping[str, NodeLink]
    secret_policy: SecretPolicy
    reserved_secrets: frozenset[str]

    def model(self, name: str) -> tuple[ModelEntry, bool]:
        """The model a replica is started from: the revision's, or a held model's stable one (True)."""
        held = self.held.get(name)
        return (held[0], True) if held is not None else (self.desired.models[name], False)

    def weights(self, model_name: str, node: str) -> WeightSource | None:
        """What `node` is told about the model's weights (core.fetch_plan), the origin token read here."""
        entry, held = self.model(model_name)
        src = entry.spec.source
        manifest = None if held else self.desired.manifests.get(model_name)
        return None if src is None else self.fetchable(src, node, manifest)

    def fetchable(self, src: Source, node: str, manifest: tuple[ManifestFile, ...] | None) -> WeightSource:
        """A weights or adapter source as `node` fetches it: through the mirror, its token read here, only
        when the operator's binding map lets it go to the host it would be sent to."""
        d = self.desired
        use = source_use(src, d.cluster.mirror.origin)
        token = None if use is None else read_bound_secret(use, self.secret_policy, self.reserved_secrets)
        entry = d.catalog.nodes.get(node)
        return weight_source(
            src,
            d.cluster.mirror,
            airgapped=entry is not None and entry.spec.airgapped,
            manifest=manifest,
            token=token,
        )

    def spec(
        self, placement: Placement, shard: ShardPlacement, key: str, source: WeightSource | None
    ) -> ShardSpec:
        d = self.desired
        model = self.model(placement.model)[0]
        entry = model.profile(placement.profile)
        assert entry is not None
        profile = entry.profile
        cluster_engine = d.cluster.engines.get(profile.engine)
        return ShardSpec(
            replica_id=placement.replica_id,
            shard_rank=shard.rank,
            shard_count=len(placement.shards),
            model=placement.model,
            profile=profile.name,
            engine=profile.engine,
            engine_version=profile.engine_version or (cluster_engine.version if cluster_engine else None),
            source=source,
            context_length=model.spec.context_length,
            slots=profile.slots,
            cpu_cores=profile.cpu_cores,
            gpus=list(shard.gpus),
            cuda_devices=self._cuda_devices(shard),
            tp=profile.tp,
            pp=profile.pp,
            args=dict(profile.args),
            # Catalog.build already refused a disallowed name; filtering again keeps the rule in one function.
            env=repo_rules.filter_env(profile.engine, profile.env)[0],
            api_key=key,
            fingerprint=placement.fingerprint,
            served_model_name=placement.model,
            trust_remote_code=placement.model in d.cluster.security.trust_remote_code,
            **self._meeting(placement, shard),
            adapters=[
                ShardAdapter(name=n, source=self.fetchable(a.source, shard.node, None), rank=a.rank)
                for n, a in d.catalog.adapters_of(placement.model)
            ]
            if profile.engine in LORA_ENGINES
            else [],
            kv_events=self._kv_events(placement.model),
        )

    def _cuda_devices(self, shard: ShardPlacement) -> list[str]:
        """CUDA_VISIBLE_DEVICES for a shard placed on MIG instances, from what its node reported."""
        link = self.links.get(shard.node)
        return mig.cuda_devices(link.inventory.gpus or [] if link is not None else [], shard.gpus)

    def _kv_events(self, model: str) -> KvEventsRequest | None:
        """Ask for the engine's KV-cache events when the model's routing policy weighs prefixes (the router
        scores them precisely from the events; an engine with no publisher ignores it)."""
        policy = self.desired.catalog.policy_for(model)
        return KvEventsRequest(hash_seed=policy.prefix.hash_seed) if policy.weights.prefix > 0 else None

    def _fabric_address(self, node: str) -> str | None:
        entry = self.desired.catalog.nodes.get(node)
        link = self.links.get(node)
        seen = link.address if link is not None and link.address != "?" else None
        if entry is None:
            return seen
        spec = entry.spec
        return distributed.fabric_address(spec.fabric_address, spec.address, spec.local, seen)

    def _meeting(self, placement: Placement, shard: ShardPlacement) -> dict[str, Any]:
        """A multi-node shard's rendezvous (rank 0's fabric address and the replica's port) and its own
        fabric address; nothing for a single-node one."""
        if len(placement.shards) < 2:
            return {}
        head = next(s for s in placement.shards if s.rank == 0)
        host = self._fabric_address(head.node)
        own = self._fabric_address(shard.node)
        if host is None or own is None:
            return {}  # the agent refuses the shard and says what is missing
        port = distributed.rendezvous_port(placement.replica_id)
        return {"rendezvous": Rendezvous(host=host, port=port), "fabric_address": own}
