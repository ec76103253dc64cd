"""Whole-repo checks: what no single document can know (names unique, references resolve, no loops) and the
profile arithmetic. Pure: documents in, a list of SemanticError out; `Catalog.build` refuses any error.

`tolerate` names documents that exist but failed an earlier stage: references to them are not reported again
as "missing", since the real problem is already reported where it is.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from llmgw.core.config.checks.adapter_checks import check_adapters
from llmgw.core.config.checks.capacity_checks import check_capacity
from llmgw.core.config.checks.checker import Checker, Document as Document
from llmgw.core.config.checks.console_checks import check_console
from llmgw.core.config.checks.disagg_checks import check_disaggregation
from llmgw.core.config.checks.engine_build_checks import check_engine_builds
from llmgw.core.config.checks.eval_checks import check_evals
from llmgw.core.config.checks.facility_checks import check_facilities
from llmgw.core.config.checks.guardrail_checks import check_guardrails
from llmgw.core.config.checks.person_checks import check_people
from llmgw.core.config.checks.reach_checks import (
    addresses,
    cluster_secrets_stay_home,
    mirror_addresses,
    node_reach,
    repo_reachable,
    secret_refs,
    trust_grants,
    webhook_url,
)
from llmgw.core.config.checks.serving_checks import check_serving
from llmgw.core.config.errors import PathPart, SemanticError
from llmgw.core.config.models import (
    CPU_ENGINES,
    ENDPOINT_CAPABILITIES,
    Cluster,
    Model,
    ModelSpec,
    Node,
    Notification,
    Organization,
    Profile,
    Project,
    RoutingPolicy,
    Team,
)
from llmgw.core.config.specs.peer_spec import peer_of
from llmgw.core.config.validation import did_you_mean

_MIG = re.compile(r"(^mig-)|(\d+g\.\d+gb)", re.IGNORECASE)
GPU_ENGINES = frozenset({"vllm", "sglang", "trtllm"})


def is_mig_class(gpu_class: str) -> bool:
    """MIG slices (`a100-1g.10gb`, `mig-3g.40gb`) are one device each: they cannot be combined."""
    return bool(_MIG.search(gpu_class))


def check(
    documents: Sequence[Document], tolerate: Mapping[str, frozenset[str]] | None = None
) -> list[SemanticError]:
    """Every whole-repo problem of `documents` (errors and warnings)."""
    checker = Checker(documents, tolerate or {})
    _unique_names(checker)
    _model_names(checker)
    for index, doc in enumerate(documents):
        if isinstance(doc, Model):
            _model(checker, index, doc)
        elif isinstance(doc, Node):
            _node_serving(checker, index, doc)
        elif isinstance(doc, Notification):
            webhook_url(checker, index, doc)
    trust_grants(checker)
    mirror_addresses(checker)
    _fallback_cycles(checker)
    _references(checker)
    check_capacity(documents, checker.add)
    check_facilities(documents, checker.add)
    check_guardrails(documents, checker.add)
    check_disaggregation(documents, checker.add)
    check_adapters(documents, checker.add)
    check_evals(documents, checker.add)
    check_people(documents, checker.add)
    check_console(documents, checker.add)
    check_engine_builds(documents, checker.add)
    check_serving(documents, checker.add)
    for index, doc in enumerate(documents):
        secret_refs(checker, index, doc, ())
    cluster_secrets_stay_home(checker)
    return checker.errors


def _unique_names(c: Checker) -> None:
    seen: dict[tuple[str, str], int] = {}
    cluster_first: int | None = None
    for index, doc in enumerate(c.documents):
        if isinstance(doc, Cluster):
            if cluster_first is not None:
                first = c.documents[cluster_first].metadata.name
                c.add(
                    index,
                    ("kind",),
                    f"a second Cluster document (the first is `{first}`)",
                    "keep exactly one",
                )
                continue
            cluster_first = index
        if isinstance(doc, Model):
            continue  # models share one namespace with aliases: see _model_names
        key = (doc.kind, doc.metadata.name)
        if key in seen:
            c.add(
                index,
                ("metadata", "name"),
                f"{doc.kind} `{doc.metadata.name}` is defined twice",
                "rename one",
            )
        else:
            seen[key] = index


def _model_names(c: Checker) -> None:
    for index, doc in enumerate(c.documents):
        if not isinstance(doc, Model):
            continue
        name = doc.metadata.name
        if name in c.model_names:
            other = c.canonical[name]
            if other == name:
                c.add(index, ("metadata", "name"), f"model `{name}` is defined twice", "rename one")
            else:
                c.add(
                    index,
                    ("metadata", "name"),
                    f"model name `{name}` is an alias of model `{other}`",
                    "rename one",
                )
            continue
        c.model_names[name] = index
        c.canonical[name] = name
    for index, doc in enumerate(c.documents):
        if not isinstance(doc, Model):
            continue
        for pos, alias in enumerate(doc.spec.aliases):
            path = ("spec", "aliases", pos)
            if alias == doc.metadata.name:
                c.add(index, path, f"alias `{alias}` is the model's own name", "remove it")
            elif alias in c.canonical:
                other = c.canonical[alias]
                what = (
                    f"the name of model `{other}`"
                    if other == alias
                    else f"already an alias of model `{other}`"
                )
                c.add(
                    index,
                    path,
                    f"alias `{alias}` is {what}",
                    "names and aliases must be unique across models",
                )
            else:
                c.canonical[alias] = doc.metadata.name
                c.model_names[alias] = index


def _node_serving(c: Checker, index: int, doc: Node) -> None:
    # Engines are behind the agent's key check either way; listening everywhere still widens who can try keys.
    if doc.spec.serving_listen_all:
        c.add(
            index,
            ("spec", "serving_listen_all"),
            "the agent accepts engine traffic on every address of this node (0.0.0.0)",
            "set `serving_address` to the address routers reach instead, unless NAT hides it from the node",
            warning=True,
        )
    if doc.spec.serving_address in ("0.0.0.0", "::"):
        c.add(
            index,
            ("spec", "serving_address"),
            f"`{doc.spec.serving_address}` is not an address routers can reach",
            "give the node's address on the routers' network, or `serving_listen_all: true` to listen on all",
        )


def _model(c: Checker, index: int, doc: Model) -> None:
    _model_bounds(c, index, doc.spec)
    addresses(c, index, doc)
    node_reach(c, index, doc)
    repo_reachable(c, index, doc)
    _capabilities(c, index, doc.spec)
    _model_profiles(c, index, doc.spec)
    _model_fallbacks(c, index, doc)


def _model_bounds(c: Checker, index: int, spec: ModelSpec) -> None:
    """Scaling, output length and what serves the model: the numbers and choices that must agree."""
    scaling = spec.scaling
    if scaling.min > scaling.max:
        c.add(
            index,
            ("spec", "scaling", "min"),
            f"min {scaling.min} is above max {scaling.max}",
            "make min <= max",
        )
    if scaling.min == 0 and scaling.max > 0 and scaling.idle_timeout is None:
        c.add(
            index,
            ("spec", "scaling"),
            "an on-demand model (min 0) needs `idle_timeout`",
            "add e.g. `idle_timeout: 10m`, after which unused replicas stop",
        )
    if spec.max_output_tokens is not None and spec.max_output_tokens >= spec.context_length:
        c.add(
            index,
            ("spec", "max_output_tokens"),
            f"max_output_tokens {spec.max_output_tokens} leaves no room for a prompt in context_length "
            f"{spec.context_length}",
            f"make it below {spec.context_length}, or leave it unset to let a request use what its prompt leaves",
        )
    if not spec.profiles and spec.provider is None:
        c.add(
            index,
            ("spec",),
            "a model needs `profiles` or a `provider`",
            "add a profile, e.g. {name: cpu, engine: llamacpp}",
        )


def _model_profiles(c: Checker, index: int, spec: ModelSpec) -> None:
    profile_names: set[str] = set()
    for pos, profile in enumerate(spec.profiles):
        path: tuple[PathPart, ...] = ("spec", "profiles", pos)
        if profile.name in profile_names:
            c.add(
                index,
                (*path, "name"),
                f"profile `{profile.name}` is defined twice in this model",
                "rename one",
            )
        profile_names.add(profile.name)
        if spec.source is None and profile.engine != "sim":
            c.add(
                index,
                (*path, "engine"),
                f"engine {profile.engine} needs weights but the model has no `source`",
                "add `spec.source: {path: ...}` or `{url: ...}`",
            )
        _profile(c, index, path, profile)
        _llamacpp_endpoint_flags(c, index, path, profile, spec.effective_capabilities)


def declared_peers(documents: Sequence[Document]) -> frozenset[str]:
    """The names of the peers the repo's Cluster declares."""
    return frozenset(p.name for d in documents if isinstance(d, Cluster) for p in d.spec.peers)


def _model_fallbacks(c: Checker, index: int, doc: Model) -> None:
    peers = declared_peers(c.documents)
    for pos, fallback in enumerate(doc.spec.fallbacks):
        path = ("spec", "fallbacks", pos)
        target = c.canonical.get(fallback)
        if target is None and peer_of(fallback, peers) is not None:
            continue  # a peer's model: what the peer offers is known online (plan, the controller), not here
        if target is None:
            if not c.tolerated("Model", fallback):
                hint = did_you_mean(fallback, c.canonical) or "name a model or an alias defined in the repo"
                c.add(index, path, f"fallback `{fallback}` is not a model or alias", hint)
        elif target == doc.metadata.name:
            c.add(index, path, f"fallback `{fallback}` is this model itself", "remove it")


def _profile(c: Checker, index: int, path: tuple[PathPart, ...], p: Profile) -> None:
    if p.gpu_class is None:
        if p.engine not in CPU_ENGINES:
            c.add(
                index,
                (*path, "gpu_class"),
                f"engine {p.engine} needs a GPU: the profile has no `gpu_class`",
                "add e.g. `gpu_class: h100-80g` and `gpus`",
            )
        elif p.gpus:
            c.add(
                index,
                (*path, "gpus"),
                f"gpus {p.gpus} without a `gpu_class`",
                "name the gpu_class, or remove gpus for a CPU profile",
            )
    else:
        if p.gpus < 1:
            c.add(index, (*path, "gpus"), "a GPU profile needs gpus >= 1", f"add `gpus: {p.tp * p.pp}`")
        elif p.gpus * p.nodes != p.tp * p.pp:
            c.add(
                index,
                (*path, "gpus"),
                f"gpus x nodes ({p.gpus} x {p.nodes}) must equal tp x pp ({p.tp} x {p.pp})",
                "every GPU of the replica holds one tensor/pipeline shard",
            )
        if is_mig_class(p.gpu_class) and (p.gpus > 1 or p.nodes > 1):
            c.add(
                index,
                (*path, "gpus"),
                f"MIG class `{p.gpu_class}` takes exactly one device",
                "use gpus: 1, tp: 1, nodes: 1",
            )
    if p.nodes > 1 and p.engine in ("sglang", "trtllm"):
        # The agent starts multi-node replicas for vLLM over Ray only: a clean plan must not end in a refused start.
        c.add(
            index,
            (*path, "nodes"),
            f"{p.engine} replicas across nodes are not started by llmgw yet (nodes {p.nodes})",
            "use nodes: 1, or engine: vllm (multi-node over Ray)",
        )
    if p.engine == "llamacpp":
        if p.tp > 1:
            c.add(index, (*path, "tp"), f"llama.cpp does not do tensor parallelism (tp {p.tp})", "use tp: 1")
        if p.pp > 1:
            c.add(
                index, (*path, "pp"), f"llama.cpp does not do pipeline parallelism (pp {p.pp})", "use pp: 1"
            )
        if p.nodes > 1:
            c.add(
                index,
                (*path, "nodes"),
                f"llama.cpp does not run across nodes (nodes {p.nodes})",
                "use nodes: 1",
            )


def _capabilities(c: Checker, index: int, spec: ModelSpec) -> None:
    """`without` contradicts no declared capability, and leaves the model an endpoint to serve."""
    for pos, capability in enumerate(spec.without):
        if capability in spec.capabilities:
            c.add(
                index,
                ("spec", "without", pos),
                f"`{capability}` is both declared in `capabilities` and said to be lacking in `without`",
                "keep it in one of the two",
            )
    if spec.without and not ENDPOINT_CAPABILITIES & set(spec.effective_capabilities):
        c.add(
            index,
            ("spec", "without"),
            f"without {', '.join(spec.without)} the model serves no endpoint (chat, completions, embeddings, "
            "rerank or score)",
            "remove the endpoint it does serve from `without`",
        )


# The capabilities llama-server serves only when started with a flag, and the profile arg that sets it: without
# it the router sends the model's requests to an engine that answers 501 ("Start it with `--embeddings`").
_LLAMACPP_CAPABILITY_ARGS = {"embeddings": "embeddings", "rerank": "rerank"}


def _llamacpp_endpoint_flags(
    c: Checker, index: int, path: tuple[PathPart, ...], p: Profile, capabilities: Sequence[str]
) -> None:
    if p.engine != "llamacpp":
        return
    for capability in capabilities:
        arg = _LLAMACPP_CAPABILITY_ARGS.get(capability)
        if arg is not None and p.args.get(arg) is not True:
            pooling = "; a chat model's GGUF also needs `pooling: mean`" if capability == "embeddings" else ""
            c.add(
                index,
                path,
                f"the model declares `{capability}`, but llama-server on profile `{p.name}` serves it only "
                f"when started with --{arg}",
                f"add `{arg}: true` to the profile's args, or remove `{capability}` from capabilities{pooling}",
            )


def _fallback_cycles(c: Checker) -> None:
    graph: dict[str, list[tuple[int, str]]] = {}
    for index, doc in enumerate(c.documents):
        if isinstance(doc, Model) and c.model_names.get(doc.metadata.name) == index:
            edges = []
            for pos, name in enumerate(doc.spec.fallbacks):
                target = c.canonical.get(name)
                if target is not None and target != doc.metadata.name:
                    edges.append((pos, target))
            graph[doc.metadata.name] = edges
    done: set[str] = set()
    reported: set[frozenset[str]] = set()
    for start in graph:
        stack: list[tuple[str, int]] = []  # (model, fallback position taken)
        _walk(c, graph, start, stack, done, reported)


def _walk(
    c: Checker,
    graph: Mapping[str, list[tuple[int, str]]],
    node: str,
    stack: list[tuple[str, int]],
    done: set[str],
    reported: set[frozenset[str]],
) -> None:
    if node in done:
        return
    on_stack = [name for name, _ in stack]
    if node in on_stack:
        loop = on_stack[on_stack.index(node) :]
        key = frozenset(loop)
        if key not in reported:
            reported.add(key)
            first, pos = stack[on_stack.index(node)]
            route = " -> ".join([*loop, node])
            c.add(
                c.model_names[first],
                ("spec", "fallbacks", pos),
                f"fallbacks loop: {route}",
                "break the loop by removing one fallback",
            )
        return
    for pos, target in graph.get(node, []):
        stack.append((node, pos))
        _walk(c, graph, target, stack, done, reported)
        stack.pop()
    done.add(node)


def _references(c: Checker) -> None:
    policies = c.names_of(RoutingPolicy)
    orgs = c.names_of(Organization)
    teams = c.names_of(Team)

    def policy(index: int, path: tuple[PathPart, ...], name: str | None) -> None:
        if name is not None and name not in policies and not c.tolerated("RoutingPolicy", name):
            c.add(
                index,
                path,
                f"routing policy `{name}` is not defined",
                did_you_mean(name, policies) or "add a RoutingPolicy document with that name",
            )

    for index, doc in enumerate(c.documents):
        if isinstance(doc, Cluster):
            policy(index, ("spec", "router", "default_policy"), doc.spec.router.default_policy)
        elif isinstance(doc, Model):
            policy(index, ("spec", "routing_policy"), doc.spec.routing_policy)
        elif isinstance(doc, Team):
            _parent(c, index, ("spec", "organization"), "Organization", doc.spec.organization, orgs)
        elif isinstance(doc, Project):
            if doc.spec.team is not None:
                _parent(c, index, ("spec", "team"), "Team", doc.spec.team, teams)
            if doc.spec.organization is not None:
                _parent(c, index, ("spec", "organization"), "Organization", doc.spec.organization, orgs)
        if isinstance(doc, Organization | Team | Project) and doc.spec.models is not None:
            for pos, pattern in enumerate(doc.spec.models):
                matched = any(fnmatch.fnmatchcase(name, pattern) for name in c.canonical)
                if not matched and not c.tolerated("Model", pattern):
                    c.add(
                        index,
                        ("spec", "models", pos),
                        f"`{pattern}` matches no model or alias",
                        did_you_mean(pattern, c.canonical),
                        warning=True,
                    )


def _parent(
    c: Checker, index: int, path: tuple[PathPart, ...], kind: str, name: str, known: Mapping[str, int]
) -> None:
    if name not in known and not c.tolerated(kind, name):
        c.add(
            index,
            path,
            f"{kind} `{name}` is not defined",
            did_you_mean(name, known) or f"add a {kind} document named `{name}`",
        )
