"""The Catalog: built only by its validating constructor, immutable, and the lookups others rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llmgw.adapters.repo_files import load_repo
from llmgw.core.config.checks.semantic import is_mig_class
from llmgw.core.config.models import Model, Organization, Project, RoutingPolicy, Team
from llmgw.core.desired.catalog import Catalog, profile_fingerprint
from llmgw.core.errors import CatalogError, LlmgwError
from llmgw.core.tenancy.projects import tenant_chain

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cluster-repo"


def model(name: str, **spec: Any) -> Model:
    spec.setdefault("context_length", 1024)
    spec.setdefault("profiles", [{"name": "sim", "engine": "sim"}])
    return Model.model_validate(
        {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": name}, "spec": spec}
    )


def doc(cls: Any, name: str, **spec: Any) -> Any:
    kind = cls.__name__
    return cls.model_validate(
        {"apiVersion": "llmgw/v1", "kind": kind, "metadata": {"name": name}, "spec": spec}
    )


@pytest.fixture(scope="module")
def example() -> Catalog:
    result = load_repo(EXAMPLE, revision="rev1")
    assert result.catalog is not None, result.errors
    return result.catalog


def test_example_catalog(example: Catalog) -> None:
    assert example.revision == "rev1"
    assert example.cluster_name == "laptop"
    assert example.cluster.router.default_policy == "balanced"
    assert set(example.models) == {"gemma-3-270m", "sim-chat", "sim-embed", "sim-batch", "sim-rerank"}
    assert set(example.nodes) == {"local"} and example.nodes["local"].labels["role"] == "dev"
    assert example.models["sim-batch"].on_demand


def test_resolve_by_name_or_alias(example: Catalog) -> None:
    gemma = example.resolve("gemma")
    assert gemma is not None and gemma.name == "gemma-3-270m"
    assert example.resolve("gemma-3-270m") is gemma
    assert example.resolve("gpt-4") is None


def test_fallback_chain_is_transitive_ordered_and_resolves_aliases() -> None:
    catalog = Catalog.build(
        [
            model("a", fallbacks=["b-alias", "c"]),
            model("b", aliases=["b-alias"], fallbacks=["d"]),
            model("c", fallbacks=["d"]),
            model("d"),
            model("e", fallbacks=["c", "a"]),
        ]
    )
    assert catalog.fallback_chain("a") == ("b", "c", "d")
    assert catalog.fallback_chain("b-alias") == ("d",)
    assert catalog.fallback_chain("e") == ("c", "a", "d", "b")  # its own first, then theirs, each once
    assert catalog.fallback_chain("d") == ()
    assert catalog.fallback_chain("nope") == ()


def test_policy_for_model_cluster_default_and_builtin(example: Catalog) -> None:
    assert example.policy_for("chat") is example.policies["session"]
    assert example.policy_for("gemma") is example.policies["balanced"]
    bare = Catalog.build([model("m")])
    assert bare.policy_name_for("m") is None and bare.policy_for("m").picker == "p2c"


def test_allowed_with_globs_aliases_and_inheritance() -> None:
    catalog = Catalog.build(
        [
            model("gemma-3-270m", aliases=["gemma"]),
            model("sim-chat"),
            model("sim-embed"),
            model("big"),
            doc(Organization, "acme", models=["gemma*", "sim-*"]),
            doc(Team, "research", organization="acme"),  # inherits the organization's list
            doc(Project, "playground", team="research", models=["gemma", "sim-chat", "big"]),
            doc(Project, "open", team="research"),
            doc(Project, "direct", organization="acme", models=["sim-embed"]),
        ]
    )
    assert catalog.allowed("playground", "gemma")
    assert catalog.allowed("playground", "gemma-3-270m")  # the project lists the alias
    assert catalog.allowed("playground", "sim-chat")
    assert not catalog.allowed("playground", "sim-embed")  # the project does not list it
    assert not catalog.allowed("playground", "big")  # the project does, the organization does not
    assert catalog.allowed("open", "sim-embed")  # inherited all the way from the organization
    assert not catalog.allowed("open", "big")
    assert catalog.allowed("direct", "sim-embed") and not catalog.allowed("direct", "sim-chat")
    assert not catalog.allowed("nobody", "gemma") and not catalog.allowed("open", "unknown-model")


def test_tenant_chain(example: Catalog) -> None:
    """The catalog's tenants, as routers are told them, give the chain the limiter reads (core.tenancy)."""
    chain = tenant_chain(example.tenants(), "playground")
    assert chain is not None
    assert (chain.project, chain.team, chain.organization) == ("playground", "research", "acme")
    assert [t.level for t in chain.levels] == ["organization", "team", "project"]
    budget = chain.levels[0].limits.budget
    assert budget is not None and budget.amount == 500
    direct = Catalog.build([model("m"), doc(Organization, "o"), doc(Project, "p", organization="o")])
    direct_chain = tenant_chain(direct.tenants(), "p")
    assert direct_chain is not None and direct_chain.team is None and direct_chain.organization == "o"
    assert tenant_chain(example.tenants(), "nope") is None


def test_fingerprints_are_stable_and_follow_what_a_replica_depends_on() -> None:
    base = model(
        "m", source={"path": "/w.gguf"}, profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}]
    )
    again = model(
        "m", source={"path": "/w.gguf"}, profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}]
    )
    fp = Catalog.build([base]).models["m"].profiles[0].fingerprint
    assert fp == Catalog.build([again]).models["m"].profiles[0].fingerprint
    assert len(fp) == 64
    # Spelling out a default changes nothing; a real edit, a new source or context length does.
    explicit = model(
        "m",
        source={"path": "/w.gguf"},
        profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2, "tp": 1}],
    )
    assert profile_fingerprint(explicit.spec.profiles[0], explicit.spec) == fp
    edits = [
        model(
            "m", source={"path": "/w.gguf"}, profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 1}]
        ),
        model(
            "m", source={"path": "/v.gguf"}, profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}]
        ),
        model(
            "m",
            source={"path": "/w.gguf"},
            context_length=4096,
            profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}],
        ),
    ]
    assert len({fp, *(profile_fingerprint(e.spec.profiles[0], e.spec) for e in edits)}) == 4
    # Prices and scaling do not touch a running replica.
    priced = model(
        "m",
        source={"path": "/w.gguf"},
        prices={"input_per_million": 1},
        scaling={"max": 3},
        profiles=[{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}],
    )
    assert profile_fingerprint(priced.spec.profiles[0], priced.spec) == fp


def test_catalog_is_immutable_and_only_built_by_build(example: Catalog) -> None:
    with pytest.raises(TypeError):
        Catalog(
            **{
                f: getattr(example, f)
                for f in (
                    "models",
                    "aliases",
                    "policies",
                    "cluster",
                    "cluster_name",
                    "nodes",
                    "organizations",
                    "teams",
                    "projects",
                )
            }
        )
    with pytest.raises(AttributeError):
        example.revision = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        example.models["new"] = example.models["sim-chat"]  # type: ignore[index]
    assert example.with_revision("rev2").revision == "rev2" and example.revision == "rev1"


@pytest.mark.parametrize(
    ("documents", "words"),
    [
        ([model("a"), model("a")], "model `a` is defined twice"),
        ([model("a"), model("b", aliases=["a"])], "alias `a` is the name of model `a`"),
        (
            [model("a", aliases=["x"]), model("b", aliases=["x"])],
            "alias `x` is already an alias of model `a`",
        ),
        ([model("a", fallbacks=["b"])], "fallback `b` is not a model or alias"),
        ([model("a", fallbacks=["a"])], "is this model itself"),
        ([model("a", fallbacks=["b"]), model("b", fallbacks=["a"])], "fallbacks loop: a -> b -> a"),
        (
            [
                model(
                    "a",
                    source={"path": "/w"},
                    profiles=[{"name": "g", "engine": "vllm", "gpu_class": "h100-80g"}],
                )
            ],
            "needs gpus >= 1",
        ),
        (
            [
                model(
                    "a",
                    source={"path": "/w"},
                    profiles=[{"name": "g", "engine": "vllm", "gpu_class": "h100-80g", "gpus": 4, "tp": 2}],
                )
            ],
            "gpus x nodes (4 x 1) must equal tp x pp (2 x 1)",
        ),
        (
            [
                model(
                    "a",
                    source={"path": "/w"},
                    profiles=[
                        {"name": "g", "engine": "sglang", "gpu_class": "a100-3g.40gb", "gpus": 2, "tp": 2}
                    ],
                )
            ],
            "MIG class `a100-3g.40gb` takes exactly one device",
        ),
        (
            [
                model(
                    "a",
                    source={"path": "/w"},
                    profiles=[
                        {"name": "g", "engine": "llamacpp", "gpu_class": "l4", "gpus": 1, "nodes": 2, "pp": 2}
                    ],
                )
            ],
            "llama.cpp does not run across nodes",
        ),
        (
            [model("a", source={"path": "/w"}, profiles=[{"name": "g", "engine": "trtllm"}])],
            "engine trtllm needs a GPU",
        ),
        ([model("a", profiles=[{"name": "g", "engine": "sim", "gpus": 2}])], "gpus 2 without a `gpu_class`"),
        ([model("a", profiles=[{"name": "c", "engine": "llamacpp"}])], "engine llamacpp needs weights"),
        ([model("a", profiles=[])], "a model needs `profiles` or a `provider`"),
        ([model("a", routing_policy="fast")], "routing policy `fast` is not defined"),
        ([model("a"), doc(Team, "t", organization="nope")], "Organization `nope` is not defined"),
        ([model("a"), doc(Project, "p", team="nope")], "Team `nope` is not defined"),
        (
            [model("a"), doc(RoutingPolicy, "p"), doc(RoutingPolicy, "p")],
            "RoutingPolicy `p` is defined twice",
        ),
    ],
)
def test_build_refuses_with_every_problem(documents: list[Any], words: str) -> None:
    with pytest.raises(CatalogError) as caught:
        Catalog.build(documents)
    assert isinstance(caught.value, LlmgwError)
    assert any(words in e.message for e in caught.value.errors), [e.describe() for e in caught.value.errors]


def test_a_model_served_by_a_provider_needs_no_profile() -> None:
    provider = {"url": "https://api.example.com/v1", "model": "x", "key": {"env": "LLMGW_SECRET_KEY"}}
    catalog = Catalog.build([model("ext", profiles=[], provider=provider)])
    assert catalog.models["ext"].profiles == ()


def test_mig_classes() -> None:
    assert is_mig_class("a100-1g.10gb") and is_mig_class("mig-3g.40gb") and is_mig_class("H100-7G.80GB")
    assert not is_mig_class("h100-80g") and not is_mig_class("l4-24g")
