"""Every list command takes --json, the one option of llmgw.cli.output (so it reads and behaves the same)."""

from __future__ import annotations

from typing import Any

import typer

from llmgw.cli.main import app

LIST_COMMANDS = [
    ("status",),
    ("nodes",),
    ("replicas",),
    ("models",),
    ("explain",),
    ("events",),
    ("logs",),
    ("usage",),
    ("audit",),
    ("notifications",),
    ("keys", "list"),
    ("weights", "list"),
    ("mirror", "list"),
]


def _command(path: tuple[str, ...]) -> Any:
    # Typer's own click types: looked at by what they have, not by isinstance against the click package.
    command: Any = typer.main.get_command(app)
    for name in path:
        assert hasattr(command, "get_command"), path
        found = command.get_command(None, name)
        assert found is not None, f"no command `llmgw {' '.join(path)}`"
        command = found
    return command


def test_every_list_command_has_the_shared_json_option() -> None:
    shared = _command(("nodes",)).params
    (json_help,) = {p.help for p in shared if "--json" in getattr(p, "opts", ())}
    for path in LIST_COMMANDS:
        options = [p for p in _command(path).params if "--json" in getattr(p, "opts", ())]
        assert len(options) == 1, f"`llmgw {' '.join(path)}` has no --json"
        assert options[0].help == json_help, f"`llmgw {' '.join(path)}` --json is not output.JsonOpt"
