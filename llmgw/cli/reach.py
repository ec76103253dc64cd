"""How a command reaches a running controller: the `--controller` and `--token-file` options, the admin client
they make, and a failed call as one clear line on stderr and exit status 1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from llmgw.cli import output
from llmgw.cli.admin_client import (
    CONTROLLER_ENV,
    DEFAULT_CONTROLLER,
    AdminClient,
    default_token_files,
    environ,
    plaintext_warning,
    resolve_token,
)
from llmgw.cli.output import fail

__all__ = [
    "ControllerOpt",
    "JsonOpt",
    "TokenOpt",
    "controller_client",
    "fail",
]

ControllerOpt = Annotated[
    str | None,
    typer.Option("--controller", help=f"Controller URL (env {CONTROLLER_ENV}; default {DEFAULT_CONTROLLER})"),
]
TokenOpt = Annotated[
    Path | None, typer.Option("--token-file", help="File holding the admin token (env LLMGW_TOKEN)")
]
JsonOpt = output.JsonOpt


def controller_client(controller_url: str | None, token_file: Path | None) -> AdminClient:
    env = environ()
    url = controller_url or env.get(CONTROLLER_ENV) or DEFAULT_CONTROLLER
    token = resolve_token(token_file, env, default_token_files(None, Path.cwd()))
    client = AdminClient(url, token)
    warning = plaintext_warning(client.url)
    if warning is not None:
        output.console(stderr=True).print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    return client
