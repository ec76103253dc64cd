"""`llmgw` imports only the module of the command it runs (llmgw/cli/main.py): the owners table must name
every command the full app has, or a command would be missing when run on its own."""

from __future__ import annotations

import subprocess
import sys

import typer

from llmgw.cli import main


def _names(app: typer.Typer) -> set[str]:
    commands = {c.name or (c.callback.__name__ if c.callback else "") for c in app.registered_commands}
    return commands | {g.name or "" for g in app.registered_groups}


def test_every_command_of_the_app_has_its_owner_and_each_owner_registers_what_it_says() -> None:
    assert _names(main.build()) == set(main._OWNER)
    for module, commands in main.OWNERS.items():
        assert _names(main.build([module])) == set(commands), module


def test_a_command_runs_with_only_its_own_module_imported() -> None:
    code = (
        "import sys; sys.argv = ['llmgw', 'validate', '--help']\n"
        "from llmgw.cli import main\n"
        "try:\n    main.main()\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('llmgw.cli.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = out.strip().splitlines()[-1]
    assert "llmgw.cli.repo.validate" in loaded
    assert "llmgw.cli.data.bench_cmds" not in loaded and "llmgw.cli.data.store_cmds" not in loaded, loaded


def test_a_subcommand_another_module_adds_to_a_group_is_there_when_run_on_its_own() -> None:
    code = (
        "import sys; sys.argv = ['llmgw', 'model', 'check', '--help']\n"
        "from llmgw.cli import main\n"
        "main.main()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "llmgw model check" in done.stdout, done.stdout
