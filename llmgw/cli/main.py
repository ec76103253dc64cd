"""The `llmgw` command: one typer app; each command group lives in its own module and is registered here.

A command imports only the module that owns it: importing every group (the store's driver, aiohttp's client,
every pydantic model) took twice as long as `llmgw plan` needs, and `validate` and `plan` run on every pull
request. `llmgw --help`, an unknown command and `app` (what tests and the console script use) build the whole
app. Adding a command group is one line in OWNERS; tests/test_cli_owners.py checks the table against the app.

Every command's errors that derive from `LlmgwError` end at one edge, `Commands.invoke`: the message on stderr and
exit code 1, never a traceback. A command catches one itself only to add to it or to go on.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import Any

import typer
from typer.core import TyperGroup

from llmgw.core.errors import ConfigInvalidError, LlmgwError

# module under llmgw.cli -> the top-level commands and groups its `register(app)` adds.
OWNERS: dict[str, tuple[str, ...]] = {
    "repo.validate": ("validate",),
    "repo.schemas": ("schemas",),
    "data.store_cmds": ("keys", "store"),
    "data.usage_cmds": ("usage",),
    "repo.plan_cmds": ("plan", "apply"),
    "fleet.controller_cmds": ("controller", "status", "nodes", "replicas", "models", "explain"),
    "deploy.node_cmds": ("engine-check", "node"),
    "deploy.up_cmd": ("up",),
    "deploy.server_cmds": ("server",),
    "data.mirror_cmds": ("model", "mirror"),
    "fleet.weights_cmds": ("weights",),
    "fleet.ops_cmds": ("audit", "notifications"),
    "fleet.doctor_cmds": ("doctor",),
    "data.bench_cmds": ("bench", "capacity"),
    "fleet.request_cmds": ("request",),
    "fleet.rollout_cmds": ("restart",),
    "fleet.facility_cmds": ("facility",),
    "fleet.logs_cmds": ("logs", "events"),
    "deploy.upgrade_cmds": ("upgrade",),
    "data.traffic_cmds": ("traffic",),
    "repo.guard_cmds": ("guard",),
    "fleet.eval_cmds": ("eval",),
    "data.mirror_upkeep_cmds": (),
    "data.model_update_cmds": (),
}
# Groups another module adds subcommands to: `model check` is eval_cmds', beside mirror_cmds' `model`;
# `mirror import-ollama|unused|remove` are mirror_upkeep_cmds', `model updates|update` model_update_cmds'.
EXTENDS: dict[str, tuple[str, ...]] = {
    "model": ("fleet.eval_cmds", "data.model_update_cmds"),
    "mirror": ("data.mirror_upkeep_cmds",),
}
_OWNER = {command: module for module, commands in OWNERS.items() for command in commands}


class Commands(TyperGroup):
    """The app's top group: the one place a command's `LlmgwError` becomes `error: MESSAGE` and exit code 1."""

    def invoke(self, ctx: Any) -> Any:  # typer's own click Context
        try:
            return super().invoke(ctx)
        except LlmgwError as exc:
            from llmgw.cli import output

            output.fail(str(exc), exc.errors if isinstance(exc, ConfigInvalidError) else ())


def _register(target: typer.Typer, module_name: str) -> None:
    module = importlib.import_module(f"llmgw.cli.{module_name}")
    if module_name == "repo.validate":
        target.command("validate")(module.validate)
    elif module_name == "repo.schemas":
        target.add_typer(module.app, name="schemas")
    else:
        module.register(target)


def build(modules: Iterable[str] | None = None) -> typer.Typer:
    """The app with the given command modules (all of them by default)."""
    built = typer.Typer(
        cls=Commands,
        name="llmgw",
        help="Declarative, git-driven controller for a fleet of LLM inference engines.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    # A callback keeps it a group: a typer app with one command would otherwise run it without its name.
    built.callback()(_group)
    for name in OWNERS if modules is None else modules:
        _register(built, name)
    return built


def _group() -> None:
    """Declarative, git-driven controller for a fleet of LLM inference engines."""


def _owners(argv: list[str]) -> list[str] | None:
    """The modules the command in argv needs; None for `--help`, no command or an unknown one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    owner = None if first is None else _OWNER.get(first)
    if first is None or owner is None:
        return None
    return [owner, *EXTENDS.get(first, ())]


_full: typer.Typer | None = None


def __getattr__(name: str) -> Any:
    global _full
    if name == "app":
        if _full is None:
            _full = build()
        return _full
    raise AttributeError(name)


def main() -> None:
    owners = _owners(sys.argv[1:])
    (build() if owners is None else build(owners))()
