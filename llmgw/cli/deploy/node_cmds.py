"""`llmgw node add`, `llmgw node bootstrap`, `llmgw engine-check`: nodes joining over SSH.

`node add` only writes a Node document into the cluster repo for review (GitOps: the controller bootstraps it
once it is committed). `node bootstrap` runs the same steps now, from this machine, for an operator who needs
the node at once. Both read the repo with the same loader the controller uses.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, cast

import typer
from ruamel.yaml import YAML

from llmgw.adapters.repo_files import load_repo
from llmgw.cli import output
from llmgw.core.config.models import NAME_PATTERN, Cluster, Node, SecretRef, node_document
from llmgw.core.config.schemas import ID_BASE, schema_file_name
from llmgw.core.config.secretrefs import DEFAULT_ENV_PREFIX, SecretPolicy, SecretRefError, resolve

if TYPE_CHECKING:
    from llmgw.adapters.ssh.bootstrap import Step
    from llmgw.adapters.ssh.remote import SshTarget
    from llmgw.adapters.ssh.wheels import Wheelhouse

RepoOpt = Annotated[Path, typer.Option("--repo", help="Cluster repo directory")]
CaOpt = Annotated[
    Path,
    typer.Option("--ca-dir", help="The cluster CA directory (the controller's ca_dir; created if absent)"),
]
# The controller's default state dir, so an operator beside it needs no flags.
DEFAULT_STATE = Path(".llmgw/controller")
ServiceMode = Literal["auto", "systemd", "process"]

node_app = typer.Typer(help="Nodes joining the cluster over SSH.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(node_app, name="node")
    app.command("engine-check")(engine_check)


# ---------------------------------------------------------------------------------------------- node add


def _schema_comment(repo: Path) -> str:
    """Point editors at the Node schema: the repo's own copy when it carries one, else the published one."""
    local = repo / "schemas" / schema_file_name("Node")
    ref = f"../schemas/{schema_file_name('Node')}" if local.exists() else ID_BASE + schema_file_name("Node")
    return f"# yaml-language-server: $schema={ref}\n"


def _labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            output.fail(f"--label {item!r}: write KEY=VALUE")
        labels[key] = value
    return labels


def added_node_document(
    name: str,
    address: str,
    user: str,
    port: int,
    identity_file: str | None,
    labels: dict[str, str],
    host_key: str | None,
    fabric: str | None,
) -> dict[str, Any]:
    ssh: dict[str, Any] = {"user": user, "port": port}
    if identity_file:
        ssh["identity"] = {"file": identity_file}
    if host_key:
        ssh["host_key"] = host_key
    spec: dict[str, Any] = {"address": address, "ssh": ssh}
    if fabric:
        spec["fabric"] = fabric
    return node_document(name, labels, spec)


def render_node(repo: Path, doc: dict[str, Any]) -> str:
    Node.model_validate(doc)  # the same model the loader checks, so what is written validates
    yaml = YAML()
    yaml.default_flow_style = False
    out = io.StringIO()
    yaml.dump(doc, out)
    name = doc["metadata"]["name"]
    return (
        _schema_comment(repo)
        + f"# Written by `llmgw node add {name}`: review, commit, and the controller bootstraps it.\n"
        + out.getvalue()
    )


@node_app.command("add")
def node_add(
    name: Annotated[str, typer.Argument(help="Node name (lower-case letters, digits, . _ -)")],
    address: Annotated[str, typer.Option("--address", help="Host name or IP address")],
    user: Annotated[str, typer.Option("--user", help="SSH user the controller logs in as")],
    port: Annotated[int, typer.Option("--port", help="SSH port")] = 22,
    identity_file: Annotated[
        str | None,
        typer.Option("--identity-file", help="Private key file: its name under the controller's secrets dir"),
    ] = None,
    label: Annotated[
        list[str] | None, typer.Option("--labels", "--label", help="KEY=VALUE, repeatable")
    ] = None,
    host_key: Annotated[
        str | None, typer.Option("--host-key", help="Pin the node's host key (`ssh-ed25519 AAAA...`)")
    ] = None,
    fabric: Annotated[str | None, typer.Option("--fabric", help="Interconnect this node shares")] = None,
    repo: RepoOpt = Path("."),
) -> None:
    """Write nodes/NAME.yaml into the cluster repo for review; never overwrites."""
    if not re.fullmatch(NAME_PATTERN, name):
        output.fail(f"node name {name!r}: use lower-case letters, digits, '.', '_' and '-' (at most 63)")
    if not repo.is_dir():
        output.fail(f"--repo {repo}: not a directory")
    path = repo / "nodes" / f"{name}.yaml"
    if path.exists():
        output.fail(f"{path} exists; edit it instead (node add never overwrites)")
    loaded = load_repo(repo)
    if any(d.kind == "Node" and d.name == name for d in loaded.documents):
        other = next(d.file for d in loaded.documents if d.kind == "Node" and d.name == name)
        output.fail(f"a Node named {name} is already declared in {other}")
    doc = added_node_document(
        name, address, user, port, identity_file, _labels(label or []), host_key, fabric
    )
    try:
        text = render_node(repo, doc)
    except ValueError as exc:
        output.fail(f"the node would not validate: {exc}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("x", encoding="utf-8") as fh:  # "x": a file appearing meanwhile is not overwritten
        fh.write(text)
    typer.echo(f"wrote {path}; review and commit it (or run `llmgw node bootstrap {name}` now)")


# ---------------------------------------------------------------------------------------------- bootstrap


def _load(repo: Path, name: str) -> tuple[Node, Cluster | None]:
    result = load_repo(repo)
    if not result.ok:
        first = result.errors[0].format_text() if result.errors else "invalid"
        output.fail(
            f"the cluster repo {repo} does not validate ({len(result.errors)} errors); first: {first}"
        )
    node = next((d.document for d in result.documents if d.kind == "Node" and d.name == name), None)
    if not isinstance(node, Node):
        known = ", ".join(d.name for d in result.documents if d.kind == "Node") or "none"
        output.fail(f"no Node named {name} in {repo} (nodes: {known})")
    cluster = next((d.document for d in result.documents if d.kind == "Cluster"), None)
    return node, cluster if isinstance(cluster, Cluster) else None


def _secret(ref: SecretRef, secrets: SecretPolicy) -> str:
    try:
        return resolve(ref, secrets)
    except SecretRefError as exc:
        output.fail(f"the agent token (spec.controller.token): {exc}")


def _policy(secrets_dir: Path, env_prefix: str) -> SecretPolicy:
    return SecretPolicy(secrets_dir, env_prefix).absolute()


SecretsDirOpt = Annotated[
    Path,
    typer.Option(
        "--secrets-dir",
        help="Where the repo's {file: NAME} secret references are (the controller's secrets_dir)",
    ),
]
EnvPrefixOpt = Annotated[
    str,
    typer.Option("--secret-env-prefix", help="Prefix the repo's {env: NAME} references must have"),
]


@node_app.command("router-cert")
def node_router_cert(
    name: Annotated[str, typer.Argument(help="The router's name (its certificate says router:NAME)")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write router.crt, router.key, ca.crt")],
    ca_dir: CaOpt = DEFAULT_STATE / "ca",
) -> None:
    """Issue a router's client certificate from the cluster CA: with a CA, the controller's router stream
    (which carries every engine key) asks for one beside the router token; a node's certificate does not do."""
    import os

    from llmgw.adapters.ssh.ca import CAError, ClusterCA

    try:
        ca = ClusterCA.open(ca_dir, create=False)
        issued = ca.router_cert(name)
    except CAError as exc:
        output.fail(str(exc))
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    for file, data, mode in (
        ("router.crt", issued.cert_pem, 0o644),
        ("router.key", issued.key_pem, 0o600),
        ("ca.crt", ca.cert_pem, 0o644),
    ):
        fd = os.open(out / file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    typer.echo(
        f"router:{name} (serial {issued.serial:x}) in {out}: llmgw-router --controller-cert {out}/router.crt "
        f"--controller-key {out}/router.key --controller-ca {out}/ca.crt"
    )


_WheelhouseOpt = Annotated[
    Path | None,
    typer.Option(
        "--wheelhouse", help="Prebuilt agent wheels (default: built into .llmgw/controller/wheelhouse)"
    ),
]
_PrefixOpt = Annotated[str, typer.Option("--prefix", help="Install prefix on the node")]
_AuthOpt = Annotated[str, typer.Option("--auth", help="tls (cluster CA) or token (development)")]
_ServiceOpt = Annotated[str, typer.Option("--service", help="auto, systemd or process")]
_ControllerOpt = Annotated[
    str | None,
    typer.Option(
        "--controller",
        envvar="LLMGW_CONTROLLER",
        help="Admin URL to watch for registration (needed with --token-file or $LLMGW_TOKEN)",
    ),
]
_TokenFileOpt = Annotated[Path | None, typer.Option("--token-file", help="Admin token file")]
_WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait for the agent to register")]
_RegisterTimeoutOpt = Annotated[float, typer.Option("--register-timeout", help="Seconds")]
_InsecureAcceptHostKeyOpt = Annotated[
    bool,
    typer.Option(
        "--insecure-accept-host-key", help="Accept any host key (first contact on a trusted network)"
    ),
]


def _check_bootstrap_flags(auth: str, service: str, prefix: str) -> None:
    from llmgw.adapters.ssh.render import prefix_problem

    if auth not in ("tls", "token") or service not in ("auto", "systemd", "process"):
        output.fail("--auth takes tls or token; --service takes auto, systemd or process")
    if problem := prefix_problem(prefix):
        output.fail(f"--prefix: {problem}")


def _controller_token(auth: str, cluster: Cluster | None, secrets: SecretPolicy) -> str | None:
    """The Cluster's controller token, which `--auth token` needs (None: the Cluster gives none)."""
    settings = cluster.spec if cluster is not None else None
    if auth == "token" and (settings is None or settings.controller.token is None):
        output.fail("--auth token needs spec.controller.token in the Cluster document")
    if settings is not None and settings.controller.token is not None:
        # Written beside the certificate too: the controller's hub asks agents for both.
        return _secret(settings.controller.token, secrets)
    return None


def _target_and_wheels(
    node: Node, repo: Path, secrets: SecretPolicy, wheelhouse: Path | None, insecure_accept_host_key: bool
) -> tuple[SshTarget, Wheelhouse]:
    """How to reach the node over SSH, and the wheels to install there (`--wheelhouse`, else built)."""
    from llmgw.adapters.ssh import wheels
    from llmgw.adapters.ssh.remote import StepFailed, target_for

    try:
        target = target_for(
            node, repo, os.environ, secrets=secrets, insecure_accept_host_key=insecure_accept_host_key
        )
        house = wheels.load(wheelhouse) if wheelhouse else wheels.build(DEFAULT_STATE / "wheelhouse")
    except (StepFailed, wheels.WheelhouseError) as exc:
        output.fail(str(exc))
    return target, house


@node_app.command("bootstrap")
def node_bootstrap(
    name: Annotated[str, typer.Argument(help="Node declared in the repo")],
    repo: RepoOpt = Path("."),
    ca_dir: CaOpt = DEFAULT_STATE / "ca",
    wheelhouse: _WheelhouseOpt = None,
    prefix: _PrefixOpt = "/opt/llmgw",
    auth: _AuthOpt = "tls",
    service: _ServiceOpt = "auto",
    controller: _ControllerOpt = None,
    token_file: _TokenFileOpt = None,
    wait: _WaitOpt = True,
    register_timeout: _RegisterTimeoutOpt = 120.0,
    insecure_accept_host_key: _InsecureAcceptHostKeyOpt = False,
    secrets_dir: SecretsDirOpt = DEFAULT_STATE / "secrets",
    secret_env_prefix: EnvPrefixOpt = DEFAULT_ENV_PREFIX,
) -> None:
    """Bootstrap one node now: check, install the agent, configure, start, wait for it to register."""
    from llmgw.adapters.ssh.bootstrap import BootstrapOptions, bootstrap_node
    from llmgw.adapters.ssh.ca import ClusterCA
    from llmgw.adapters.ssh.render import Layout

    _check_bootstrap_flags(auth, service, prefix)
    node, cluster = _load(repo, name)
    secrets = _policy(secrets_dir, secret_env_prefix)
    settings = cluster.spec if cluster is not None else None
    address = settings.controller.address if settings else "127.0.0.1:7070"
    ca = ClusterCA.open(ca_dir) if auth == "tls" else None
    token = _controller_token(auth, cluster, secrets)
    target, house = _target_and_wheels(node, repo, secrets, wheelhouse, insecure_accept_host_key)

    opts = BootstrapOptions(
        controllers=(address,),
        wheelhouse=house,
        registered=_registration_check(controller, token_file, repo, address) if wait else None,
        ca=ca,
        token=token,
        layout=Layout(prefix=prefix),
        service=cast(ServiceMode, service),  # checked above
        register_timeout=register_timeout,
        labels={name: dict(node.metadata.labels)},
        engines={
            e: {"path": s.path, "version": s.version}
            for e, s in (settings.engines if settings else {}).items()
        },
        on_step=_print_step,
    )
    result = asyncio.run(bootstrap_node(target, opts))
    if not result.ok:
        raise typer.Exit(1)


def _registration_check(
    controller: str | None, token_file: Path | None, repo: Path, address: str
) -> Callable[[str, float], Awaitable[bool]]:
    """`registered(node, since)` over the admin API: a Ready node is taken as registered (the admin API has
    no registration time comparable to ours)."""
    from llmgw.cli.admin_client import (
        AdminClient,
        AdminError,
        choose_controller,
        default_token_files,
        environ,
        resolve_token,
    )

    try:
        admin_token = resolve_token(token_file, environ(), default_token_files(repo, Path.cwd()))
        # The repo's controller.address only for a local controller's own token (L5, admin_client).
        client = AdminClient(choose_controller(controller, address, admin_token), admin_token)
    except AdminError as exc:
        output.fail(f"{exc} (or pass --no-wait)")

    async def registered(node_name: str, since: float) -> bool:
        try:
            data = await asyncio.to_thread(client.get, "/api/v1/nodes")
        except AdminError:
            return False
        return any(n.get("name") == node_name and n.get("state") == "Ready" for n in data.get("nodes", []))

    return registered


_STEP_STYLE = {"changed": "yellow", "unchanged": "green", "failed": "red", "skipped": "dim"}


def _print_step(node_name: str, step: Step) -> None:
    output.console().print(
        f"{node_name}  {step.name:<12} [{_STEP_STYLE[step.status]}]{step.status:<9}[/]  {step.detail}",
        highlight=False,
    )


# ---------------------------------------------------------------------------------------------- engine-check


def engine_check(
    node_name: Annotated[str, typer.Argument(metavar="NODE", help="Node declared in the repo")],
    engine: Annotated[str, typer.Argument(metavar="ENGINE", help="sim, llamacpp, vllm, sglang or trtllm")],
    repo: RepoOpt = Path("."),
    prefix: Annotated[str, typer.Option("--prefix", help="Install prefix on the node")] = "/opt/llmgw",
    insecure_accept_host_key: Annotated[
        bool, typer.Option("--insecure-accept-host-key", help="Accept any host key")
    ] = False,
    secrets_dir: SecretsDirOpt = DEFAULT_STATE / "secrets",
    secret_env_prefix: EnvPrefixOpt = DEFAULT_ENV_PREFIX,
) -> None:
    """Run ENGINE's version (or help) on NODE over SSH and print what it says."""
    from llmgw.adapters.ssh.engines import check_local, check_remote
    from llmgw.adapters.ssh.remote import StepFailed, target_for
    from llmgw.adapters.ssh.render import Layout, prefix_problem

    if problem := prefix_problem(prefix):
        output.fail(f"--prefix: {problem}")
    node, cluster = _load(repo, node_name)
    engines = {str(k): v for k, v in cluster.spec.engines.items()} if cluster is not None else {}
    try:
        if node.spec.local:
            result = asyncio.run(check_local(node_name, engine, engines))
        else:
            target = target_for(
                node,
                repo,
                os.environ,
                secrets=_policy(secrets_dir, secret_env_prefix),
                insecure_accept_host_key=insecure_accept_host_key,
            )
            result = asyncio.run(check_remote(target, engine, engines, Layout(prefix=prefix)))
    except StepFailed as exc:
        output.fail(str(exc))
    typer.echo(f"$ {result.command}   # on {node_name}")
    typer.echo(result.output)
    if not result.ok:
        raise typer.Exit(1)
