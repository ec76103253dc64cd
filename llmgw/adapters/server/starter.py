"""The starter cluster repo `llmgw server init` makes when not given one: a copy of the example (the project's
examples/cluster-repo) told where this machine's controller and router are and where the cluster secret is,
committed as a git repository the controller follows. The laptop's local Node is dropped, or with `--node`
renamed to this machine's node.
"""

from __future__ import annotations

import io
import shlex
import shutil
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from llmgw.adapters.server import layout as L


def _round_trip() -> YAML:
    y = YAML()  # round trip: the example's comments stay for the operator to read
    y.preserve_quotes = True
    return y


def _cluster(text: str, s: L.ServerSettings) -> str:
    y = _round_trip()
    doc: Any = y.load(text)
    spec = doc.setdefault("spec", {})
    spec.setdefault("controller", {})["address"] = s.controller_address
    router = spec.setdefault("router", {})
    router["listen"] = s.router_listen
    # Every controller (a standby made by `llmgw server add` too) derives the same keys from one secret.
    spec.setdefault("secret", {"file": L.ServerLayout().cluster_secret.rsplit("/", 1)[1]})
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue()


def _node(text: str, node: str) -> str:
    y = _round_trip()
    doc: Any = y.load(text)
    doc["metadata"]["name"] = node
    out = io.StringIO()
    y.dump(doc, out)
    return out.getvalue()


def write(source: Path, target: Path, s: L.ServerSettings, node: str | None) -> None:
    """Copy `source` to `target` (a new directory) told about this machine."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".git", "*.pyc"))
    cluster = target / "cluster.yaml"
    cluster.write_text(_cluster(cluster.read_text(encoding="utf-8"), s), encoding="utf-8")
    local_nodes = sorted((target / "nodes").glob("*.yaml")) if (target / "nodes").is_dir() else []
    for path in local_nodes:
        if node is None or "local: true" not in path.read_text(encoding="utf-8"):
            path.unlink()
            continue
        path.write_text(_node(path.read_text(encoding="utf-8"), node), encoding="utf-8")
        path.rename(path.with_name(f"{node}.yaml"))
        node = None  # one local node: this machine's


def commit_command(repo: str) -> str:
    """Make `repo` a git repository with the starter as its first commit (on branch main)."""
    q = shlex.quote(repo)
    ident = "-c user.name=llmgw-server-init -c user.email=llmgw@localhost"
    return (
        f"git -C {q} init -q -b main && git -C {q} add -A && "
        f"git -C {q} {ident} commit -q -m 'Starter cluster repo (llmgw server init)'"
    )
