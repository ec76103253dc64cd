"""Secrets bound to destinations: which secret a repo document may have sent where. Pure.

Confinement (llmgw.core.config.secretrefs) says where a secret is *read from*; it cannot say where it *goes*. A Model
or an Adapter pairs `source.token` or `provider.key` with a URL of its author's choice, and the agent or the
router then presents the secret there as a Bearer token. So a reference of those kinds resolves only
when the operator's binding map (`bindings.yaml` in the secrets directory: outside the repo, like the
directory itself) names the secret, the purpose and the destination's host:

    hf-token: {purposes: [source-token], hosts: [huggingface.co]}
    $LLMGW_SECRET_OPENAI_B: {purposes: [provider-key], hosts: [api.openai.com]}

A Notification's signing secret is never sent (the webhook receives an HMAC under it), so it needs no line.

A `{file: NAME}` reference is named by its file name, an `{env: NAME}` one by `$NAME`. Hosts are exact
(case-insensitive) or `*.example.com` for its subdomains, with `:PORT` to pin a port.

The Cluster's and the Nodes' own references (the cluster secret, the shared agent token, SSH identities) need no
binding: the controller uses them itself. A Cluster's peer keys (`peers[].key`) are sent to the peer, and bound
as provider keys to its host. Whatever they name is the cluster's own, and no other kind's
reference may name it, bound or not (`reserved_names`): the cluster secret derives every other credential.

`binding_problem` is the decision; `secret_uses` lists every reference of a document it applies to, for
`llmgw validate` and `llmgw plan`; the map file is parsed by `parse_bindings` and read in secretrefs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal, get_args
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.core.config.base import SecretRef
from llmgw.core.config.errors import PathPart
from llmgw.core.config.models import (
    Adapter,
    Cluster,
    ClusterSpec,
    Model,
    Node,
    NodeSpec,
    Notification,
    Source,
)
from llmgw.core.errors import LlmgwError

__all__ = [
    "BINDINGS_FILE",
    "Binding",
    "BindingProblem",
    "Purpose",
    "SecretBindingError",
    "SecretBindings",
    "SecretUse",
    "binding_problem",
    "destination_host",
    "documents_reserved_names",
    "parse_bindings",
    "ref_name",
    "reserved_names",
    "secret_uses",
    "source_use",
]

BINDINGS_FILE = "bindings.yaml"

Purpose = Literal["source-token", "provider-key", "notification-secret", "oidc-client-secret"]
PURPOSES: tuple[Purpose, ...] = get_args(Purpose)
# The purposes whose secret itself travels to the destination (as a Bearer token). A Notification's signing
# secret never leaves the controller (the webhook gets an HMAC under it), so it needs no binding; it still
# may not name the cluster's own secret.
# The console's OpenID Connect client secret goes to the provider's token endpoint (HTTP Basic).
SENT: frozenset[Purpose] = frozenset({"source-token", "provider-key", "oidc-client-secret"})


class SecretBindingError(LlmgwError):
    """The binding map cannot be read, or refuses a reference; the message says which line would be right."""


@dataclass(frozen=True)
class Binding:
    purposes: frozenset[Purpose]
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class SecretBindings:
    """The operator's map: secret name (`hf-token`, `$LLMGW_SECRET_X`) -> what may receive it."""

    entries: Mapping[str, Binding]


@dataclass(frozen=True)
class SecretUse:
    """One reference a document makes, the purpose it is read for and the URL it would be presented to."""

    ref: SecretRef
    purpose: Purpose
    destination: str  # a URL (its host is what is bound)


@dataclass(frozen=True)
class BindingProblem:
    message: str  # what is refused
    line: str | None  # the binding map line that would allow it; None when nothing may (a reserved name)
    replaces: bool = False  # the line replaces the secret's existing one rather than being added

    def advice(self) -> str:
        """What to do to the map: `add to bindings.yaml: LINE` or `change its line in bindings.yaml to: LINE`."""
        if self.replaces:
            return f"change its line in {BINDINGS_FILE} to: {self.line}"
        return f"add to {BINDINGS_FILE}: {self.line}"

    def text(self) -> str:
        if self.line is None:
            return self.message
        return f"{self.message}; if the operator means it, {self.advice()} (in the secrets directory)"


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    purposes: list[Purpose] = Field(min_length=1)
    hosts: list[str] = Field(min_length=1)


def ref_name(ref: SecretRef) -> str:
    """The name a binding keys a reference by: the file name (normalised: `./a//b` is `a/b`), or `$ENV`."""
    if ref.env is not None:
        return "$" + ref.env
    return str(PurePosixPath((ref.file or "").replace("\\", "/")))


def destination_host(url: str) -> str | None:
    """`host` or `host:port` (the port only when the URL names one), lower case; None for no host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    host = (parts.hostname or "").lower()
    if not host:
        return None
    return host if port is None else f"{host}:{port}"


def _host_allowed(pattern: str, url: str) -> bool:
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    want_host, _, want_port = pattern.lower().partition(":")
    if want_port:
        default = {"https": 443, "http": 80}.get(parts.scheme)
        try:
            port = parts.port if parts.port is not None else default
        except ValueError:
            return False
        if str(port) != want_port:
            return False
    if want_host.startswith("*."):
        return host.endswith(want_host[1:]) and len(host) > len(want_host) - 1
    return host == want_host


def _flow(name: str, purposes: Iterable[str], hosts: Iterable[str]) -> str:
    return f"{name}: {{purposes: [{', '.join(purposes)}], hosts: [{', '.join(hosts)}]}}"


def binding_problem(
    bindings: SecretBindings, use: SecretUse, reserved: frozenset[str] = frozenset()
) -> BindingProblem | None:
    """Why `use` may not have its secret, or None. `reserved`: the names the Cluster and Nodes use."""
    name = ref_name(use.ref)
    if name in reserved:
        return BindingProblem(
            f"secret {name} is the cluster's own (a Cluster or Node document names it): no {use.purpose} may "
            "name it; give this one a secret of its own",
            None,
        )
    if use.purpose not in SENT:
        return None
    host = destination_host(use.destination)
    if host is None:
        return BindingProblem(f"{use.purpose} {name}: {use.destination!r} names no host to bind to", None)
    entry = bindings.entries.get(name)
    if entry is None:
        return BindingProblem(
            f"secret {name} is not bound to any destination", _flow(name, [use.purpose], [host])
        )
    purpose_ok = use.purpose in entry.purposes
    host_ok = any(_host_allowed(p, use.destination) for p in entry.hosts)
    if purpose_ok and host_ok:
        return None
    purposes = sorted({*entry.purposes, use.purpose})
    hosts = list(entry.hosts) if host_ok else [*entry.hosts, host]
    what = f"purpose {use.purpose}" if not purpose_ok else f"host {host}"
    if not purpose_ok and not host_ok:
        what += f" nor host {host}"
    return BindingProblem(
        f"secret {name} is not bound to {what}", "change its line to " + _flow(name, purposes, hosts)
    )


def parse_bindings(data: object, where: str) -> SecretBindings:
    """The map from its parsed YAML (None: an empty file); SecretBindingError names the entry and the rule."""
    if data is None:
        return SecretBindings({})
    if not isinstance(data, dict):
        raise SecretBindingError(f"{where}: expected a mapping of secret name to {{purposes, hosts}}")
    entries: dict[str, Binding] = {}
    for key, value in data.items():
        if not isinstance(key, str) or not key:
            raise SecretBindingError(f"{where}: {key!r} is not a secret name")
        try:
            entry = _Entry.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            at = ".".join(str(p) for p in first["loc"]) or "entry"
            raise SecretBindingError(
                f"{where}: {key}.{at}: {first['msg']} (write `{_flow(key, ['provider-key'], ['api.example.com'])}`"
                f"; purposes are {', '.join(PURPOSES)})"
            ) from None
        for host in entry.hosts:
            if not host or "/" in host or " " in host:
                raise SecretBindingError(f"{where}: {key}.hosts: {host!r} is not a host (`api.example.com`)")
        entries[key] = Binding(frozenset(entry.purposes), tuple(h.lower() for h in entry.hosts))
    return SecretBindings(entries)


def reserved_names(cluster: ClusterSpec | None, nodes: Iterable[NodeSpec]) -> frozenset[str]:
    """The names the Cluster's and the Nodes' own references use: no other kind's reference may name them."""
    refs: list[SecretRef | None] = []
    if cluster is not None:
        refs += [cluster.secret, cluster.controller.token]
    refs += [n.ssh.identity for n in nodes if n.ssh is not None]
    return frozenset(ref_name(r) for r in refs if r is not None)


def documents_reserved_names(documents: Iterable[object]) -> frozenset[str]:
    """`reserved_names` of a repo's documents."""
    docs = list(documents)
    cluster = next((d.spec for d in docs if isinstance(d, Cluster)), None)
    return reserved_names(cluster, [d.spec for d in docs if isinstance(d, Node)])


def source_use(source: Source, origin: str) -> SecretUse | None:
    """Where a Model's or an Adapter's `source.token` is sent: the `url`'s server, or for a `repo` the
    Cluster's `mirror.origin` (never the mirror); None when it is sent nowhere (no token, origin `none`)."""
    where = origin if source.repo is not None else source.url
    if source.token is None or where is None or where == "none":
        return None
    return SecretUse(source.token, "source-token", where)


def secret_uses(doc: object, origin: str) -> list[tuple[tuple[PathPart, ...], SecretUse]]:
    """Every reference of `doc` that is sent somewhere, with its path in the document. `origin`: the
    Cluster's `mirror.origin`."""
    out: list[tuple[tuple[PathPart, ...], SecretUse]] = []
    if isinstance(doc, Model | Adapter) and doc.spec.source is not None:
        use = source_use(doc.spec.source, origin)
        if use is not None:
            out.append((("spec", "source", "token"), use))
    if isinstance(doc, Model) and doc.spec.provider is not None:
        provider = doc.spec.provider
        if provider.key is not None:
            out.append((("spec", "provider", "key"), SecretUse(provider.key, "provider-key", provider.url)))
    if isinstance(doc, Cluster):  # a peer's key goes to the peer's router (docs/routing.md, Federation)
        for pos, peer in enumerate(doc.spec.peers):
            if peer.key is not None:
                out.append((("spec", "peers", pos, "key"), SecretUse(peer.key, "provider-key", peer.url)))
    if isinstance(doc, Notification) and doc.spec.secret is not None:
        out.append((("spec", "secret"), SecretUse(doc.spec.secret, "notification-secret", doc.spec.url)))
    if isinstance(doc, Cluster) and doc.spec.console.identity_provider is not None:
        idp = doc.spec.console.identity_provider
        where = ("spec", "console", "identity_provider", "client_secret")
        out.append((where, SecretUse(idp.client_secret, "oidc-client-secret", idp.issuer)))
    return out
