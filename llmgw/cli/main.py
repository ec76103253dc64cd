"""The `llmgw` command: one typer app; each command group lives in its own module and is registered here.

Keep this file thin: adding a command is one import and one registration line.
"""

from __future__ import annotations

import typer

from llmgw.cli import (
    bench_cmds,
    controller_cmds,
    doctor_cmds,
    eval_cmds,
    logs_cmds,
    mirror_cmds,
    node_cmds,
    ops_cmds,
    plan_cmds,
    request_cmds,
    rollout_cmds,
    schemas,
    store_cmds,
    up_cmd,
    upgrade_cmds,
    validate,
    weights_cmds,
)

app = typer.Typer(
    name="llmgw",
    help="Declarative, git-driven controller for a fleet of LLM inference engines.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

app.command("validate")(validate.validate)
app.add_typer(schemas.app, name="schemas")
store_cmds.register(app)
plan_cmds.register(app)
controller_cmds.register(app)
node_cmds.register(app)
up_cmd.register(app)
mirror_cmds.register(app)
weights_cmds.register(app)
ops_cmds.register(app)
doctor_cmds.register(app)
bench_cmds.register(app)
request_cmds.register(app)
rollout_cmds.register(app)
logs_cmds.register(app)
upgrade_cmds.register(app)
eval_cmds.register(app)


def main() -> None:
    app()
