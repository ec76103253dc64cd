"""The router built without tracing: this tree's sources with every tracing hook taken out.

`tracing_compare.py` measures the router with tracing configured but off against the router *built without
it*. A revision from before tracing was added stops being that baseline as soon as anything else lands on the
request path, so the baseline is made from this tree instead: the llmgw, router and agent sources are copied
and the request path's hooks removed from their syntax tree —

  - an `if` that tests `self.tracer`, `call.trace` or `traceparent` (its `else`, if any, is kept);
  - an assignment to `traceparent`, and the `tracer` / `trace` / `traceparent` fields they fill;

so the copy neither begins spans nor passes a client's `traceparent` to the engine, exactly as if the
feature had never been written. The copy is checked afterwards: any name of the hooks left behind means they
changed shape, and the build fails with the file and line rather than measuring a half-stripped router.
Comments and formatting are lost in the rewritten files (ast.unparse); nothing else changes.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

__all__ = ["HOOKED_FILES", "StripError", "strip_source", "untraced_tree"]

# The files the hooks live in, relative to the repository root.
HOOKED_FILES = (
    "router/llmgw_router/path/service.py",
    "router/llmgw_router/path/accounting.py",
    "router/llmgw_router/path/upstream_call.py",
)
_HOOK_NAMES = {"tracer", "trace", "traceparent"}


class StripError(Exception):
    """The hooks are not where or what the stripper expects."""


def _mentions_hook(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ("tracer", "trace"):
            return True
        if isinstance(sub, ast.Name) and sub.id == "traceparent":
            return True
    return False


def _target_is_hook(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return target.id == "traceparent"
    if isinstance(target, ast.Attribute):
        return target.attr in _HOOK_NAMES
    return False


class _Stripper(ast.NodeTransformer):
    def __init__(self) -> None:
        self.removed = 0

    def visit_If(self, node: ast.If) -> ast.AST | list[ast.stmt] | None:
        if not _mentions_hook(node.test):
            return self.generic_visit(node)
        self.removed += 1
        # `if hook: ... elif traceparent: ...` is all hook; a plain `else` is the untraced path.
        rest = node.orelse
        if len(rest) == 1 and isinstance(rest[0], ast.If) and _mentions_hook(rest[0].test):
            rest = rest[0].orelse
        kept: list[ast.stmt] = []
        for stmt in rest:
            visited = self.visit(stmt)
            kept.extend(visited if isinstance(visited, list) else [visited] if visited is not None else [])
        return kept or None

    def visit_Assign(self, node: ast.Assign) -> ast.AST | None:
        if any(_target_is_hook(t) for t in node.targets):
            self.removed += 1
            return None
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST | None:
        if _target_is_hook(node.target):
            self.removed += 1
            return None
        return node

    def visit_Try(self, node: ast.Try) -> ast.AST | list[ast.stmt]:
        self.generic_visit(node)
        if not node.handlers and not node.finalbody:  # `try: x finally: <hook>` is just x
            return [*node.body, *node.orelse]
        return node

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        if getattr(node, "body", None) == []:  # a block that was only hooks (a try, a def, a with)
            node.body = [ast.Pass()]  # type: ignore[attr-defined]
        return node


def strip_source(source: str, where: str) -> tuple[str, int]:
    """`source` without its tracing hooks, and how many were removed."""
    tree = ast.parse(source, filename=where)
    stripper = _Stripper()
    stripped = ast.fix_missing_locations(stripper.visit(tree))
    for sub in ast.walk(stripped):
        if _mentions_hook(sub) and isinstance(sub, (ast.Attribute, ast.Name)):
            raise StripError(
                f"{where}:{sub.lineno}: a tracing hook is left after stripping: {ast.unparse(sub)}"
            )
    return ast.unparse(stripped) + "\n", stripper.removed


def untraced_tree(root: Path, into: Path) -> tuple[Path, int]:
    """Copy llmgw, router and agent of `root` under `into` and strip the hooks; returns the tree and the
    number of hooks removed (zero is an error: the baseline would be the traced router)."""
    if into.exists():
        shutil.rmtree(into)
    for part in ("llmgw", "router", "agent"):
        shutil.copytree(root / part, into / part, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    removed = 0
    for rel in HOOKED_FILES:
        path = into / rel
        text, n = strip_source(path.read_text(encoding="utf-8"), rel)
        path.write_text(text, encoding="utf-8")
        removed += n
    if removed == 0:
        raise StripError(f"no tracing hook found in {', '.join(HOOKED_FILES)}: the stripper is out of date")
    return into, removed
