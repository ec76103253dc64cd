"""`llmgw up [PATH]`: controller, router and a local agent on this machine (see llmgw.cli.deploy.up)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    app.command("up")(up)


_PathArg = Annotated[Path, typer.Argument(help="Cluster repo directory")]


_StateDirOpt = Annotated[Path, typer.Option(help="Store, tokens, agent state and the example key live here")]


_RouterListenOpt = Annotated[
    str | None,
    typer.Option(
        metavar="HOST:PORT",
        envvar="LLMGW_UP_ROUTER_LISTEN",
        help="OpenAI API address (default: the Cluster document's router.listen, 127.0.0.1:8080)",
    ),
]


_RouterMetricsListenOpt = Annotated[
    str | None,
    typer.Option(
        metavar="HOST:PORT",
        envvar="LLMGW_UP_ROUTER_METRICS_LISTEN",
        help="Router /metrics address (default: the Cluster document's router.metrics_listen)",
    ),
]


_ControllerListenOpt = Annotated[
    str | None,
    typer.Option(
        metavar="HOST:PORT",
        envvar="LLMGW_UP_CONTROLLER_LISTEN",
        help="Controller address (default: the Cluster document's controller.address); "
        "`llmgw plan/status` then need --controller",
    ),
]


_ControllerMetricsListenOpt = Annotated[
    str | None,
    typer.Option(
        metavar="HOST:PORT",
        envvar="LLMGW_UP_CONTROLLER_METRICS_LISTEN",
        help="Controller /metrics address (default: the Cluster document's controller.metrics_listen)",
    ),
]


_NoLlamacppOpt = Annotated[
    bool, typer.Option("--no-llamacpp", help="Do not offer llama.cpp to the agent (sim models only)")
]


_EnginePortsOpt = Annotated[
    str | None,
    typer.Option(
        metavar="LO-HI",
        envvar="LLMGW_UP_ENGINE_PORTS",
        help="Ports the local agent gives its engines (default: the agent's, 20000-20999)",
    ),
]


_InsecureTokenOnlyRemoteNodesOpt = Annotated[
    bool,
    typer.Option(
        "--insecure-token-only-remote-nodes",
        help="INSECURE: bootstrap the repo's remote Nodes with a bearer token sent in clear (no CA)",
    ),
]


def up(
    path: _PathArg = Path("examples/cluster-repo"),
    state_dir: _StateDirOpt = Path(".llmgw"),
    router_listen: _RouterListenOpt = None,
    router_metrics_listen: _RouterMetricsListenOpt = None,
    controller_listen: _ControllerListenOpt = None,
    controller_metrics_listen: _ControllerMetricsListenOpt = None,
    no_llamacpp: _NoLlamacppOpt = False,
    engine_ports: _EnginePortsOpt = None,
    insecure_token_only_remote_nodes: _InsecureTokenOnlyRemoteNodesOpt = False,
) -> None:
    """Run the controller, a router and a local agent on this machine until Ctrl-C, following PATH
    (a change to a file is a new revision). Prints the OpenAI base URL and a key for the repo's first project."""
    from llmgw.cli.deploy.up import run_up
    from llmgw.cli.deploy.up_processes import UpError, UpSettings, engine_ports as parse_ports

    try:
        ports = parse_ports(engine_ports) if engine_ports is not None else None
    except UpError as exc:
        raise typer.BadParameter(str(exc), param_hint="--engine-ports") from None
    settings = UpSettings(
        repo=path,
        state_dir=state_dir,
        router_listen=router_listen,
        router_metrics_listen=router_metrics_listen,
        controller_listen=controller_listen,
        controller_metrics_listen=controller_metrics_listen,
        llamacpp=not no_llamacpp,
        insecure_token_only_remote_nodes=insecure_token_only_remote_nodes,
        engine_ports=ports,
    )
    raise typer.Exit(run_up(settings))
