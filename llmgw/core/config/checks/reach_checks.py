"""Whole-repo checks of where things point (called by `semantic.check`): secret references stay where the
operator's bindings allow, addresses are not forbidden ones, nodes can reach a model's weights, the mirror and
the webhooks are where they may be."""

from __future__ import annotations

from urllib.parse import urlsplit

from llmgw_agent import repo_rules
from pydantic import BaseModel

from llmgw.core.config.checks.checker import Checker
from llmgw.core.config.errors import PathPart
from llmgw.core.config.models import (
    Cluster,
    Model,
    Notification,
    SecretRef,
)
from llmgw.core.config.secret_bindings import documents_reserved_names, ref_name, secret_uses
from llmgw.core.config.secretrefs import ref_problem
from llmgw.core.config.validation import did_you_mean
from llmgw.core.security import forbidden_address_reason


def secret_refs(c: Checker, index: int, value: object, path: tuple[PathPart, ...]) -> None:
    """Every SecretRef in a document stays inside what the controller and router processes allow (their
    secrets directory, their env prefix); said at review time, and checked again when the process reads it.
    The prefix checked here is the default one (`llmgw validate` runs without the processes' settings)."""
    if isinstance(value, SecretRef):
        problem = ref_problem(value)
        if problem is not None:
            c.add(index, (*path, problem.field), problem.message, problem.hint)
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            secret_refs(c, index, getattr(value, name), (*path, name))
    elif isinstance(value, list | tuple):
        for pos, item in enumerate(value):
            secret_refs(c, index, item, (*path, pos))
    elif isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str):
                secret_refs(c, index, item, (*path, key))


def cluster_secrets_stay_home(c: Checker) -> None:
    """A Model, Adapter or Notification reference that names a secret the Cluster or a Node names (the cluster
    secret, the agent token, an SSH key) would send the cluster's own credential to a URL its author chose:
    refused whatever the operator's binding map says (llmgw.core.config.secret_bindings)."""
    reserved = documents_reserved_names(c.documents)
    if not reserved:
        return
    cluster = next((d for d in c.documents if isinstance(d, Cluster)), None)
    origin = cluster.spec.mirror.origin if cluster is not None else "none"
    for index, doc in enumerate(c.documents):
        for path, use in secret_uses(doc, origin):
            if ref_name(use.ref) in reserved:
                c.add(
                    index,
                    (*path, "file" if use.ref.file is not None else "env"),
                    f"{use.purpose} names {ref_name(use.ref)}, the cluster's own secret (a Cluster or Node document names "
                    "it); it would be sent to " + use.destination,
                    "give this reference a secret of its own, bound to its host in the secrets directory's "
                    "bindings.yaml",
                )


def addresses(c: Checker, index: int, doc: Model) -> None:
    """A weights URL or provider URL must not reach a link-local or cloud metadata address: whoever can edit
    the repo would otherwise have nodes or routers fetch the instance's credentials. Said here, at review
    time, rather than by an agent refusing the fetch minutes after the merge."""
    spec = doc.spec
    urls: list[tuple[tuple[PathPart, ...], str]] = []
    if spec.source is not None and spec.source.url:
        urls.append((("spec", "source", "url"), spec.source.url))
    if spec.provider is not None:
        urls.append((("spec", "provider", "url"), spec.provider.url))
    for path, url in urls:
        why = forbidden_address_reason(url)
        if why is not None:
            c.add(index, path, f"{url} is refused: {why}", "use the model's own mirror or provider address")


def repo_reachable(c: Checker, index: int, doc: Model) -> None:
    """A `repo` source needs somewhere to come from: the Cluster's mirror, or an origin (not `none`)."""
    source = doc.spec.source
    if source is None or source.repo is None:
        return
    mirror = next((d.spec.mirror for d in c.documents if isinstance(d, Cluster)), None)
    if mirror is not None and mirror.url is None and mirror.origin == "none":
        c.add(
            index,
            ("spec", "source", "repo"),
            f"{source.repo} has nowhere to come from: the Cluster declares no mirror.url and mirror.origin is none",
            "declare the Cluster's mirror.url, or an origin such as https://huggingface.co",
        )


def webhook_url(c: Checker, index: int, doc: Notification) -> None:
    """A webhook is egress from the controller: http(s) only, and never a link-local or metadata address
    (the controller checks the resolved address again when it connects)."""
    url = doc.spec.url
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
        c.add(index, ("spec", "url"), f"{url!r} is not an http(s) URL", "write https://host/path")
        return
    why = forbidden_address_reason(url)
    if why is not None:
        c.add(index, ("spec", "url"), f"{url} is refused: {why}", "use the receiver's own address")


def granted_trust(c: Checker) -> frozenset[str]:
    for doc in c.documents:
        if isinstance(doc, Cluster):
            return frozenset(doc.spec.security.trust_remote_code)
    return frozenset()


def node_reach(c: Checker, index: int, doc: Model) -> None:
    """What a Model may make a node do stops at running the model: its weights file name stays in the cache,
    its profiles set only allowlisted environment names, path args stay under the replica's work directory,
    and trust_remote_code needs the Cluster's grant. The rules are the agent's (llmgw_agent.repo_rules),
    which enforces them again on whatever reaches it."""
    spec = doc.spec
    if spec.source is not None and spec.source.url:
        problem = repo_rules.weights_name_problem(spec.source.url)
        if problem:
            c.add(
                index,
                ("spec", "source", "url"),
                f"{spec.source.url} is refused: {problem}",
                "the URL's last path segment is the file name on the node: a plain name such as model.gguf",
            )
    granted = granted_trust(c)
    for pos, profile in enumerate(spec.profiles):
        path: tuple[PathPart, ...] = ("spec", "profiles", pos)
        for name in profile.env:
            problem = repo_rules.env_name_problem(profile.engine, name)
            if problem:
                c.add(
                    index,
                    (*path, "env", name),
                    problem,
                    f"{profile.engine} profiles may set {repo_rules.allowed_env_summary(profile.engine)}",
                )
        for key, value in profile.args.items():
            problem = repo_rules.path_arg_problem(profile.engine, key, value)
            if problem:
                c.add(
                    index,
                    (*path, "args", key),
                    problem,
                    "write a path relative to the replica's work directory, without `..`",
                )
        if profile.args.get(repo_rules.TRUST_REMOTE_CODE) and doc.metadata.name not in granted:
            c.add(
                index,
                (*path, "args", repo_rules.TRUST_REMOTE_CODE),
                f"trust_remote_code runs the model's own Python on the node; the Cluster does not grant it to "
                f"model `{doc.metadata.name}`",
                f"the platform team adds `{doc.metadata.name}` to the Cluster's spec.security.trust_remote_code,"
                " or remove the arg",
            )


def mirror_addresses(c: Checker) -> None:
    """The mirror and the origin are fetched by every node: the metadata-address rule of a Model's URL."""
    for index, doc in enumerate(c.documents):
        if not isinstance(doc, Cluster):
            continue
        mirror = doc.spec.mirror
        for field_name, url in (("url", mirror.url), ("origin", mirror.origin)):
            why = None if url in (None, "none") else forbidden_address_reason(url)
            if why is not None:
                c.add(
                    index,
                    ("spec", "mirror", field_name),
                    f"{url} is refused: {why}",
                    "the mirror's own address",
                )


def trust_grants(c: Checker) -> None:
    for index, doc in enumerate(c.documents):
        if not isinstance(doc, Cluster):
            continue
        for pos, name in enumerate(doc.spec.security.trust_remote_code):
            if c.canonical.get(name) != name and not c.tolerated("Model", name):
                alias_of = c.canonical.get(name)
                c.add(
                    index,
                    ("spec", "security", "trust_remote_code", pos),
                    f"`{name}` is an alias of model `{alias_of}`" if alias_of else f"`{name}` is not a model",
                    f"name the model itself: `{alias_of}`" if alias_of else did_you_mean(name, c.canonical),
                    warning=alias_of is None,
                )
        return
