"""The tracing comparison's baseline: this tree with its tracing hooks stripped (benchmarks/untraced.py)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from untraced import HOOKED_FILES, StripError, strip_source, untraced_tree  # noqa: E402

SAMPLE = """
async def handle(self, call, headers):
    traceparent = headers.get("traceparent")
    if self.tracer is not None:
        call.trace = self.tracer.begin(traceparent)
    elif traceparent is not None:
        call.traceparent = traceparent
    try:
        call.lease = await self.acquire()
    finally:
        if call.trace is not None:
            call.trace.span("limits")
    if call.trace is not None:
        call.trace.end()
    else:
        untraced = True
    return call.lease
"""


def test_hooks_go_and_the_untraced_path_stays() -> None:
    text, removed = strip_source(SAMPLE, "sample.py")
    assert removed == 4  # the traceparent read, the begin/elif, the finally's span, the end
    assert ast.unparse(ast.parse(text)) == ast.unparse(
        ast.parse(
            "async def handle(self, call, headers):\n    call.lease = await self.acquire()\n"
            "    untraced = True\n    return call.lease\n"
        )
    )


def test_a_hook_of_another_shape_fails_the_build_with_its_line() -> None:
    with pytest.raises(StripError, match=r"sample.py:3: a tracing hook is left after stripping: call.trace"):
        strip_source("def f(call):\n    x = 1\n    return call.trace\n", "sample.py")


def test_this_trees_router_stripped_imports_and_has_no_hook_left(tmp_path: Path) -> None:
    tree, removed = untraced_tree(ROOT, tmp_path / "untraced")
    assert removed >= 10
    for rel in HOOKED_FILES:
        parsed = ast.parse((tree / rel).read_text(encoding="utf-8"))
        names = {n.attr for n in ast.walk(parsed) if isinstance(n, ast.Attribute)}
        assert not names & {"tracer", "trace"}, rel
    env = {"PYTHONPATH": f"{tree}:{tree / 'router'}:{tree / 'agent'}", "PATH": "/usr/bin:/bin"}
    probe = "import llmgw_router.app, llmgw_router.path.service as s; print(s.__file__)"
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(str(tree))
