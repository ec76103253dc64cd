"""The house rules on size (docs/architecture.md): no source file over 600 lines, no function over 60, no folder
of `llmgw/` or the router with more than 15 modules, and no formatter turned off anywhere in the project's
Python (sources, tests, benchmarks, scripts).

A file or function that outgrows them is doing more than one thing; split it where the concepts part. A room
that outgrows its count holds two stages: give the second its own room (docs/architecture.md, The rooms). The
formatter lays the code out; a rule met by turning it off is not met.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "llmgw", ROOT / "router" / "llmgw_router", ROOT / "agent" / "llmgw_agent"]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_ROOM_MODULES = 15


def _files() -> list[Path]:
    return sorted(p for d in SOURCES for p in d.rglob("*.py"))


def test_the_sources_are_where_this_test_looks() -> None:
    assert len(_files()) > 100, [str(d) for d in SOURCES]


def test_no_source_file_is_over_600_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in _files()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES
    }
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_is_over_60_lines() -> None:
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


def _module_counts(package: Path) -> dict[str, int]:
    folders = [package, *(p for p in package.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    return {
        str(d.relative_to(ROOT)): len([p for p in d.glob("*.py") if p.name != "__init__.py"]) for d in folders
    }


def test_no_folder_of_llmgw_or_the_router_holds_more_than_15_modules() -> None:
    counts = {**_module_counts(ROOT / "llmgw"), **_module_counts(ROOT / "router" / "llmgw_router")}
    assert len(counts) > 10, counts  # the rooms are where this test looks
    crowded = {d: n for d, n in counts.items() if n > MAX_ROOM_MODULES}
    assert not crowded, (
        f"folders over {MAX_ROOM_MODULES} modules (split the room where the stages part): {crowded}"
    )


def test_no_fmt_skip_in_code() -> None:
    # The markers are spelled in pieces so this file does not hold them. Tests and benchmarks are code that is
    # read as much as the sources: the rule holds there too.
    markers = ("# fmt: " + "skip", "# fmt: " + "off")
    everywhere = [*SOURCES, ROOT / "tests", ROOT / "benchmarks", ROOT / "scripts"]
    files = sorted(p for d in everywhere for p in d.rglob("*.py") if "node_modules" not in p.parts)
    assert len(files) > 400, len(files)  # the tests and benchmarks are where this test looks
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if any(marker in line for marker in markers)
    ]
    assert not found, f"the formatter is turned off at (lay it out, split what grows): {found}"
