"""`llmgw model updates` and `llmgw model update MODEL --write`: new weights upstream for the repo's models.

The shell around llmgw.core.plan.weight_updates (what to ask, what the answers mean): it reads the cluster repo,
asks the origin (llmgw.adapters.source_probe.ask_updates) and, for `update --write`, edits the repo's pins
in place (llmgw.core.weights.pin_edit): the commit that follows is the update, and its revert the rollback.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from llmgw.adapters.mirror import MirrorError, MirrorStore
from llmgw.adapters.repo_files import load_repo
from llmgw.adapters.source_probe import ask_updates
from llmgw.cli import output
from llmgw.cli.data.mirror_cmds import model_app
from llmgw.cli.reach import ControllerOpt, TokenOpt, controller_client
from llmgw.core.api.weight_updates import UpdateChecksAnswer
from llmgw.core.desired.repo import LoadedDocument, Repo
from llmgw.core.errors import LlmgwError
from llmgw.core.plan.update_checks import update_json
from llmgw.core.plan.weight_updates import FOLLOW, Update
from llmgw.core.weights.manifest import manifest_json
from llmgw.core.weights.pin_edit import replace_scalar

__all__ = ["register"]


class UpdateError(LlmgwError):
    """An update that cannot be listed or written; the message says what and why."""


_RepoArg = Annotated[Path, typer.Argument(help="The cluster repo (a checkout)")]
_FollowOpt = Annotated[str, typer.Option("--follow", help="The origin's branch to compare against")]


def _load(repo: Path) -> Repo:
    loaded = load_repo(repo)
    if loaded.repo is None:
        first = loaded.errors[0] if loaded.errors else "no catalog"
        raise UpdateError(
            f"{repo}: the repo does not load ({first}); `llmgw validate {repo}` lists every error"
        )
    return loaded.repo


def _ask(repo: Repo, follow: str, model: str | None = None) -> list[Update]:
    if model is not None and model not in repo.catalog.models:
        raise UpdateError(f"no Model {model!r} in the repo")
    return asyncio.run(ask_updates(repo.catalog, follow, model))


def updates(
    repo: Annotated[
        Path | None, typer.Argument(help="The cluster repo (a checkout); not with --last")
    ] = None,
    follow: _FollowOpt = FOLLOW,
    last: Annotated[
        bool,
        typer.Option(
            "--last", help="Show the controller's last periodic check; nothing is asked of the origin"
        ),
    ] = False,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: output.JsonOpt = False,
) -> None:
    """Ask the origin whether the files each model pins changed there: current, changed, or not checked (why).
    With --last, show what the controller found at its last periodic check (the Cluster's mirror.check_every)."""
    if last:
        if repo is not None:
            raise UpdateError("--last reads the controller's last check: give no repo with it")
        _print_last(
            controller_client(controller, token_file).get_as("/api/v1/weights/updates", UpdateChecksAnswer),
            as_json,
        )
        return
    if repo is None:
        raise UpdateError(
            "give the cluster repo to ask the origin now, or --last for the controller's last check"
        )
    found = [update_json(u) for u in _ask(_load(repo), follow)]
    if as_json:
        output.print_json(found)
        return
    _print_rows(found)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    for u in rows:
        typer.echo(f"{u['model']:24} {u['state']:12} {u['source']}: {u['detail']}")
        if u.get("origin"):
            typer.echo(f"{'':37} asked {u['origin']}")


def _print_last(answer: UpdateChecksAnswer, as_json: bool) -> None:
    if as_json:
        output.print_json(answer.model_dump(mode="json"))
        return
    every = answer.check_every or "unknown (no revision applied)"
    if answer.checked_at is None:
        typer.echo(f"No check since this controller began leading (mirror.check_every: {every}).")
    else:
        typer.echo(f"Checked {_when(answer.checked_at)} (mirror.check_every: {every}).")
    if answer.next_at is not None:
        typer.echo(f"Next check {_when(answer.next_at)}.")
    _print_rows([u.model_dump(mode="json") for u in answer.updates])


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def update(
    model: Annotated[str, typer.Argument(help="The Model to move to the origin's new files")],
    repo: _RepoArg,
    follow: _FollowOpt = FOLLOW,
    write: Annotated[
        bool, typer.Option("--write", help="Edit the repo's pins (default: only say what would)")
    ] = False,
    mirror_dir: Annotated[
        Path | None,
        typer.Option(
            "--mirror-dir",
            envvar="LLMGW_MIRROR_DIR",
            help="The Cluster's mirror directory (on the mirror host): the new revision is put there first",
        ),
    ] = None,
) -> None:
    """Move a model's pins to what the origin has now: `revision` and its manifest, or `sha256`/`size_bytes`.
    When the Cluster has a mirror, the new revision's files go into it first (with --mirror-dir), so nodes fetch
    them from the mirror as any other version. Commit the edit: the plan shows the model's replicas stale and they
    roll as its `rollout` says; reverting the commit is the rollback."""
    loaded = _load(repo)
    [found] = _ask(loaded, follow, model)
    if found.state != "changed":
        raise UpdateError(f"{model}: {found.state}: {found.detail}; nothing to update")
    doc = next(d for d in loaded.documents if d.kind == "Model" and d.name == model)
    edits = _edits(doc, loaded, found)
    _to_mirror(loaded, model, found, mirror_dir, write)
    for path, text in edits.items():
        typer.echo(f"{'wrote' if write else 'would write'} {path}")
        if write:
            path.write_text(text)
    typer.echo(f"{model}: {found.detail}" + ("" if write else " (give --write to edit the repo)"))


def _to_mirror(repo: Repo, model: str, found: Update, mirror_dir: Path | None, write: bool) -> None:
    """Put a `repo` source's new revision into the Cluster's mirror before the pins move (nodes then fetch it
    from the mirror, never the origin), or say why it is not put there."""
    source = repo.catalog.models[model].spec.source
    mirror = repo.catalog.cluster.mirror.url
    if source is None or source.repo is None or found.fetch_from is None or found.revision is None:
        return
    version = f"{source.repo}@{found.revision}"
    if not mirror:
        typer.echo(f"the Cluster names no mirror: nodes fetch {version} from the origin")
        return
    if mirror_dir is None:
        typer.echo(
            f"not put into the mirror ({mirror}): no --mirror-dir given. Nodes ask the mirror for {version}, "
            "get 404 and fetch from the origin; an air-gapped node cannot. Run this on the mirror host with "
            "--mirror-dir (or `llmgw mirror add`) before applying the commit"
        )
        return
    store = MirrorStore(mirror_dir)
    if store.version_dir(source.repo, found.revision).exists():
        typer.echo(f"the mirror at {mirror_dir} already holds {version}")
        return
    if not write:
        typer.echo(f"would add {version} to the mirror at {mirror_dir} from {found.fetch_from}")
        return
    upstream = (found.upstream or source.repo, found.revision)
    try:
        asyncio.run(
            store.add_listed(
                found.fetch_from, list(found.files), source.repo, found.revision, upstream=upstream
            )
        )
    except MirrorError as exc:
        raise UpdateError(f"{version}: not put into the mirror, so the pins are not moved: {exc}") from exc
    typer.echo(f"added {version} to the mirror at {mirror_dir} from {found.fetch_from}")


def _edits(doc: LoadedDocument, repo: Repo, found: Update) -> dict[Path, str]:
    """File -> its new text: the YAML pins edited in place and, for a `repo` source, its manifest rewritten."""
    source = repo.catalog.models[doc.name].spec.source
    assert source is not None
    yaml_path = Path(doc.file)
    text = yaml_path.read_text()
    out: dict[Path, str] = {}
    if source.repo is not None:
        if source.revision is None or found.revision is None:
            raise UpdateError(f"{doc.name}: spec.source pins no revision to move (add `revision:` first)")
        text = _pin(doc, text, "revision", source.revision, found.revision)
        if source.manifest is not None:  # else the mirror publishes the new revision's (add it there first)
            manifest_path = Path(repo.root) / source.manifest.removeprefix("./")
            shape = repo.catalog.models[doc.name].shape
            out[manifest_path] = json.dumps(manifest_json(found.files, shape), indent=1) + "\n"
    else:
        [now] = found.files
        if source.sha256 is not None:
            text = _pin(doc, text, "sha256", source.sha256, now.sha256)
        if source.size_bytes is not None:
            text = _pin(doc, text, "size_bytes", str(source.size_bytes), str(now.size))
    out[yaml_path] = text
    return out


def _pin(doc: LoadedDocument, text: str, key: str, old: str, new: str) -> str:
    pos = doc.positions.values.get(("spec", "source", key))
    if pos is None:
        raise UpdateError(f"{doc.file}: Model {doc.name} has no spec.source.{key} where it was read")
    return replace_scalar(text, pos.line, pos.col, old, new)


def register(_app: typer.Typer) -> None:
    model_app.command("updates")(updates)
    model_app.command("update")(update)
