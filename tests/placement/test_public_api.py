"""The names other parts import from the core: each face's `__all__` says them, and nothing else is reached.

A face is a module or package of `llmgw.core`, directly or in one of its rooms (a package whose `__init__` holds
only its docstring, docs/architecture.md: `llmgw.core.desired`, `llmgw.core.weights`, ...); `llmgw.core.config`
has none: its modules are imported by name. Removing a name from an `__all__` is a breaking change; importing a
name a face does not export is reaching into its inside.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import llmgw.core
import llmgw.core.fleet.views
import llmgw.core.placement
import llmgw.core.plan
import llmgw.core.reconcile

ROOT = Path(__file__).parents[2]


def _is_room(package: str) -> bool:
    """A room only groups modules: its `__init__` is its docstring and nothing else."""
    init = ROOT.joinpath(*package.split("."), "__init__.py")
    body = ast.parse(init.read_text(encoding="utf-8")).body
    return len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)


def _faces(package: str) -> list[str]:
    found = []
    for info in pkgutil.iter_modules([str(ROOT.joinpath(*package.split(".")))]):
        name = f"{package}.{info.name}"
        if name == "llmgw.core.config":
            continue
        found += _faces(name) if info.ispkg and _is_room(name) else [name]
    return found


FACES = sorted(_faces("llmgw.core"))
ROOMS = sorted(
    f"llmgw.core.{info.name}"
    for info in pkgutil.iter_modules(llmgw.core.__path__)
    if info.ispkg and _is_room(f"llmgw.core.{info.name}")
)


def test_public_api():
    assert set(llmgw.core.placement.__all__) >= {"place", "explain", "Placer", "Placement", "PlacementResult"}
    assert set(llmgw.core.reconcile.__all__) >= {
        "reconcile",
        "StartReplica",
        "StopReplica",
        "MarkStale",
        "RestartReplica",
        "Wait",
        "ReconcileDecision",
        "BackoffPolicy",
    }
    assert set(llmgw.core.plan.__all__) >= {
        "make_plan",
        "plan_for_catalog",
        "catalog_documents",
        "render",
        "render_text",
        "render_json",
        "render_markdown",
        "to_dict",
        "plan_digest",
        "check_plan_current",
        "StalePlan",
    }
    assert set(llmgw.core.fleet.views.__all__) >= {
        "LiveState",
        "NodeView",
        "ReplicaView",
        "ModelView",
        "model_views",
    }


def test_the_faces_are_found():
    assert {
        "llmgw.core.desired.catalog",
        "llmgw.core.errors",
        "llmgw.core.plan",
        "llmgw.core.words",
        "llmgw.core.reconcile",
    } <= set(FACES)
    assert {"llmgw.core.desired", "llmgw.core.weights", "llmgw.core.capacity"} <= set(ROOMS)
    assert not set(ROOMS) & set(FACES)


@pytest.mark.parametrize("face", FACES)
def test_every_face_declares_what_it_exports(face: str) -> None:
    module = importlib.import_module(face)
    exported = getattr(module, "__all__", None)
    assert exported is not None, f"{face} has no __all__"
    assert len(set(exported)) == len(exported), f"{face}.__all__ names something twice"
    for name in exported:
        assert hasattr(module, name), f"{face}.__all__ names {name}, which it does not define"


def _imports_of_faces() -> list[tuple[str, str, str]]:
    """(file:line, face, name) for every `from <face> import name` in the shipped code."""
    found = []
    for top in ("llmgw", "router/llmgw_router"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module in FACES:
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    found += [(where, node.module, alias.name) for alias in node.names]
    return found


def test_everything_imported_from_a_face_is_in_its_all() -> None:
    uses = _imports_of_faces()
    assert uses, "the walk found no imports of the core: it proves nothing"
    outside = [
        f"{where}: {name} from {face}"
        for where, face, name in uses
        if not _inside(where, face) and name not in importlib.import_module(face).__all__
    ]
    assert outside == [], "import these through the face's __all__ (or add them to it):\n" + "\n".join(
        outside
    )


def _inside(where: str, face: str) -> bool:
    """A face's own modules may use its inside: `llmgw/core/plan/diff.py:3` is inside `llmgw.core.plan`."""
    module = where.split(":", 1)[0].removesuffix(".py").replace("/", ".")
    return module.startswith(face + ".")
