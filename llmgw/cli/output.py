"""Where the CLI prints: a terminal gets rich's layout at its width; a pipe or a CI log gets every column whole.

Off a terminal rich assumes 80 columns and cuts cells with "…", so replica ids and engine names lose the part
that tells them apart, and a table pasted into an issue or grepped in a CI log is useless. There is no screen
to fit there, so the width is unbounded and each table takes its natural width.
"""

from __future__ import annotations

import sys

from rich.console import Console

__all__ = ["WIDE", "console"]

WIDE = 100_000  # columns off a terminal: wider than any table, so none is cut


def console(*, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=WIDE)
