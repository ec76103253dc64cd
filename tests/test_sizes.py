"""The house rules on size (docs/architecture.md): no source file over 800 lines, no function over 80, no
folder of the router with more than 15 modules.

A file or function that outgrows them is doing more than one thing; split it where the concepts part. A room
that outgrows its count holds two stages: give the second its own room (docs/architecture.md, The router's rooms).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "llmgw", ROOT / "router" / "llmgw_router", ROOT / "agent" / "llmgw_agent"]
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
MAX_ROOM_MODULES = 15


def _files() -> list[Path]:
    return sorted(p for d in SOURCES for p in d.rglob("*.py"))


def test_the_sources_are_where_this_test_looks() -> None:
    assert len(_files()) > 100, [str(d) for d in SOURCES]


def test_no_source_file_is_over_800_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _files()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_80_lines() -> None:
    long: dict[str, int] = {}
    for path in _files():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
                # Decorators and the docstring count: they are read with the function.
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = node.end_lineno - first + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_folder_of_the_router_holds_more_than_15_modules() -> None:
    router = ROOT / "router" / "llmgw_router"
    counts = {
        str(d.relative_to(ROOT)): len([p for p in d.glob("*.py") if p.name != "__init__.py"])
        for d in [router, *(p for p in router.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    }
    assert len(counts) > 5, counts  # the rooms are where this test looks
    crowded = {d: n for d, n in counts.items() if n > MAX_ROOM_MODULES}
    assert not crowded, (
        f"folders over {MAX_ROOM_MODULES} modules (split the room where the stages part): {crowded}"
    )
