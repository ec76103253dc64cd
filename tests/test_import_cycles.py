"""No import circle among the project's own modules: every import counts, `TYPE_CHECKING` and function-local ones
too (import-linter's contracts see the arrows between floors and rooms; a circle inside one room is this test's).

The whole house holds none (issue 40 cut the last ones, in the controller and the core): the router, the
controller, the core, the CLI, the store, the adapters and the agent are held alike.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "llmgw": ROOT / "llmgw",
    "llmgw_router": ROOT / "router" / "llmgw_router",
    "llmgw_agent": ROOT / "agent" / "llmgw_agent",
}


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(module: str, path: Path) -> Iterator[str]:
    """Every name an import statement of `module` reaches, wherever the statement stands."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


@functools.cache
def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in _imported(module, path):
            target = owner(name)
            # A package's __init__ that is only named on the way (`from pkg import mod`) is no arrow of its own.
            if target is not None and target != module and modules[target].name != "__init__.py":
                graph[module].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(frozenset(component))
    return circles


def test_the_graph_sees_hidden_imports() -> None:
    # main imports workers at the top; workers.take_seat is what main calls: the arrow must be there, and the
    # function-local import in app (OpenTelemetry, loaded only when asked) must be seen as well.
    graph = _graph()
    assert "llmgw_router.workers" in graph["llmgw_router.main"]
    assert "llmgw_router.path.tracing" in graph["llmgw_router.app"]


def test_a_circle_is_found_and_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_circle_among_the_projects_modules() -> None:
    circles = sorted(sorted(c) for c in _circles(_graph()))
    assert circles == [], f"import circles (TYPE_CHECKING and function-local imports count): {circles}"
