"""`llmgw server init`: install the control plane (controller, router, store, CA, units) on this machine;
`llmgw server add`: a standby controller and/or another router on another machine, over SSH.

Each step says what it found and what it did (llmgw.adapters.server.init, .add); a second run changes nothing and
says so. Exit status 1 when a step failed (the steps after it are listed as skipped).
"""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, cast

import typer

from llmgw.cli import output
from llmgw.core.config.models import NAME_PATTERN

if TYPE_CHECKING:
    from llmgw.adapters.ssh.bootstrap import NodeResult, Step

server_app = typer.Typer(help="Install and extend the control plane on servers.", no_args_is_help=True)

_STYLE = {"changed": "green", "unchanged": "dim", "failed": "red", "skipped": "yellow"}


def register(app: typer.Typer) -> None:
    app.add_typer(server_app, name="server")


def _example_repo() -> Path | None:
    """The project's examples/cluster-repo beside the installed package (a source checkout), if there."""
    import llmgw

    found = Path(llmgw.__file__).resolve().parent.parent / "examples" / "cluster-repo"
    return found if found.is_dir() else None


def _environment(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not name.replace("_", "").isalnum():
            output.fail(
                f"--env {pair!r}: expected NAME=VALUE (e.g. --env OTEL_EXPORTER_OTLP_ENDPOINT=http://...)"
            )
        env[name] = value
    return env


_RepoOpt = Annotated[
    str | None,
    typer.Option(
        "--repo", help="Cluster repo the controller follows: a git URL or path (default: a starter)"
    ),
]
_StarterOpt = Annotated[
    Path | None,
    typer.Option(
        "--starter", help="Directory the starter repo is copied from (default: examples/cluster-repo)"
    ),
]
_StoreOpt = Annotated[
    str | None,
    typer.Option("--store", help="An existing store's DSN (default: PostgreSQL on this machine, installed)"),
]
_CaDirOpt = Annotated[
    Path | None, typer.Option("--ca-dir", help="An existing cluster CA directory (ca.key, ca.crt) to take")
]
_AddressOpt = Annotated[
    list[str] | None,
    typer.Option("--address", help="Another name or address clients use, for the certificate (repeat)"),
]
_AdvertiseOpt = Annotated[
    str | None, typer.Option("--advertise", help="Address routers and agents dial (default: the first one)")
]
_NameOpt = Annotated[
    str, typer.Option("--name", help="This machine's router name (and node name with --node)")
]
_NodeOpt = Annotated[bool, typer.Option("--node", help="Also run an agent here: the machine is a node too")]
_ServiceOpt = Annotated[str, typer.Option("--service", help="auto, systemd or process")]
_EnvOpt = Annotated[
    list[str] | None, typer.Option("--env", help="NAME=VALUE given to every service (repeat)")
]
_BinDirOpt = Annotated[
    str | None, typer.Option("--bin-dir", help="Where llmgw's executables are (default: this one's)")
]
_RootOpt = Annotated[
    Path, typer.Option("--root", help="Act on the system tree in this directory (commands through chroot)")
]
_HealthOpt = Annotated[float, typer.Option("--health-timeout", help="Seconds each service has to answer")]
_DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Look and say what each step would do; act on nothing")
]


@server_app.command("init")
def init(
    repo: _RepoOpt = None,
    starter: _StarterOpt = None,
    store: _StoreOpt = None,
    ca_dir: _CaDirOpt = None,
    address: _AddressOpt = None,
    advertise: _AdvertiseOpt = None,
    name: _NameOpt = "server",
    node: _NodeOpt = False,
    service: _ServiceOpt = "auto",
    env: _EnvOpt = None,
    bin_dir: _BinDirOpt = None,
    root: _RootOpt = Path("/"),
    health_timeout: _HealthOpt = 120.0,
    dry_run: _DryRunOpt = False,
) -> None:
    """Install the control plane on this Debian or Ubuntu machine: account, CA, certificate, store, repo,
    settings, units; start the controller and the router and wait for their /health over TLS."""
    from llmgw.adapters.server.init import init_machine
    from llmgw.adapters.server.machine import Machine
    from llmgw.adapters.server.options import InitOptions

    _check_name_and_service(name, service)
    if repo is not None and "://" not in repo and not repo.startswith("git@"):
        repo = str(Path(repo).absolute())  # the controller runs with / as its working directory
    opts = InitOptions(
        bin_dir=bin_dir or str(Path(sys.executable).parent),
        repo=repo,
        starter=starter or _example_repo(),
        store=store,
        ca_from=ca_dir.absolute() if ca_dir else None,
        addresses=tuple(address or ()),
        advertise=advertise,
        node=node,
        name=name,
        service=cast(Literal["auto", "systemd", "process"], service),  # checked above
        environment=_environment(env or []),
        health_timeout=health_timeout,
        dry_run=dry_run,
        on_step=_show,
    )
    _finish(asyncio.run(init_machine(Machine(root), opts)), dry_run)


_UserOpt = Annotated[str, typer.Option("--user", help="The account SSH logs in to there (root)")]
_PortOpt = Annotated[int, typer.Option("--port", help="Its SSH port")]
_IdentityOpt = Annotated[Path | None, typer.Option("--identity", help="Private key SSH logs in with")]
_KnownHostsOpt = Annotated[
    Path | None,
    typer.Option("--known-hosts", help="known_hosts file holding its host key (default: ~/.ssh's)"),
]
_HostKeyOpt = Annotated[
    str | None, typer.Option("--host-key", help="Its host key (ssh-ed25519 AAAA...), pinned")
]
_InsecureOpt = Annotated[
    bool, typer.Option("--insecure-accept-host-key", help="Accept any host key (a trusted network only)")
]
_AddNameOpt = Annotated[str, typer.Option("--name", help="The other machine's router name")]
_StandbyOpt = Annotated[bool, typer.Option("--controller/--no-controller", help="A standby controller there")]
_RouterOpt = Annotated[bool, typer.Option("--router/--no-router", help="A router there")]
_AddRepoOpt = Annotated[
    str | None, typer.Option("--repo", help="Git URL the standby follows (default: the controller's here)")
]
_AddBinDirOpt = Annotated[
    str | None,
    typer.Option("--bin-dir", help="Where llmgw's executables are there (default: where they are here)"),
]
_AddRootOpt = Annotated[
    Path, typer.Option("--root", help="This machine's system tree is in this directory (as for init)")
]


@server_app.command("add")
def add(
    host: Annotated[str, typer.Argument(help="The other machine's address (or name) to reach over SSH")],
    user: _UserOpt = "root",
    port: _PortOpt = 22,
    identity: _IdentityOpt = None,
    known_hosts: _KnownHostsOpt = None,
    host_key: _HostKeyOpt = None,
    insecure_accept_host_key: _InsecureOpt = False,
    name: _AddNameOpt = "server2",
    controller: _StandbyOpt = True,
    router: _RouterOpt = True,
    advertise: _AdvertiseOpt = None,
    address: _AddressOpt = None,
    repo: _AddRepoOpt = None,
    service: _ServiceOpt = "auto",
    env: _EnvOpt = None,
    bin_dir: _AddBinDirOpt = None,
    root: _AddRootOpt = Path("/"),
    health_timeout: _HealthOpt = 120.0,
    dry_run: _DryRunOpt = False,
) -> None:
    """Make a standby controller and/or another router on another Debian or Ubuntu machine, over SSH, from this
    one (where `llmgw server init` ran): it shares this machine's CA, secrets and store, opened to it."""
    from llmgw.adapters.server.add import add_machine
    from llmgw.adapters.server.machine import Machine
    from llmgw.adapters.server.options import AddOptions
    from llmgw.adapters.ssh.remote import SshTarget

    _check_name_and_service(name, service)
    target = SshTarget(
        node=host,
        host=host,
        port=port,
        user=user,
        identity_file=identity.absolute() if identity else None,
        host_key=host_key,
        known_hosts=known_hosts.absolute() if known_hosts else None,
        insecure_accept_host_key=insecure_accept_host_key,
    )
    opts = AddOptions(
        target=target,
        bin_dir=bin_dir or str(Path(sys.executable).parent),
        controller=controller,
        router=router,
        name=name,
        advertise=advertise,
        addresses=tuple(address or ()),
        repo=repo,
        service=cast(Literal["auto", "systemd", "process"], service),  # checked above
        environment=_environment(env or []),
        health_timeout=health_timeout,
        dry_run=dry_run,
        on_step=_show,
    )
    _finish(asyncio.run(add_machine(Machine(root), opts)), dry_run)


def _check_name_and_service(name: str, service: str) -> None:
    if service not in ("auto", "systemd", "process"):
        output.fail(f"--service {service!r}: expected auto, systemd or process")
    if not re.fullmatch(NAME_PATTERN, name):
        output.fail(
            f"--name {name!r}: lower-case letters, digits, '.', '_' and '-', starting with a letter or digit"
        )


def _finish(result: NodeResult, dry_run: bool) -> None:
    if not result.ok:
        raise typer.Exit(1)
    if dry_run:
        typer.echo("dry run: nothing was changed")
    elif not result.changed:
        typer.echo("everything was in place: nothing changed")


def _show(step: Step) -> None:
    output.console().print(
        f"{step.name:<13} [{_STYLE[step.status]}]{step.status:<9}[/]  {step.detail}", highlight=False
    )
