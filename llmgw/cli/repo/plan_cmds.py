"""`llmgw plan` and `llmgw apply`: the pull-request workflow, with Terraform's conventions.

`plan` validates the cluster repo with the one pipeline, takes the live state from the controller (or a saved
snapshot, for CI without access to the cluster) and prints the difference; `--detailed-exitcode` gives 0 (no
changes), 1 (error), 2 (changes). `--out FILE` saves a plan that `apply` refuses once the live state moved on.

`apply` validates again (an invalid repo is never sent), sends the revision to the controller and, with
`--wait`, follows sync and per-model health until Synced and Healthy, Degraded, or the timeout.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import socket
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, NoReturn

import typer

from llmgw.adapters.repo_files import load_repo
from llmgw.cli import admin_client
from llmgw.cli.admin_client import AdminClient, AdminError
from llmgw.cli.repo import follow, plan_suggest, plan_usage
from llmgw.cli.repo.validate import BindingsOpt, with_bindings
from llmgw.core.desired.repo import LoadResult
from llmgw.core.errors import LlmgwError
from llmgw.core.fleet.views import LiveState
from llmgw.core.words import short

if TYPE_CHECKING:
    from llmgw.core.plan import Plan

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


class PlanFormat(StrEnum):
    text = "text"
    json = "json"
    markdown = "markdown"


class Send(StrEnum):
    auto = "auto"
    path = "path"
    files = "files"


class CommandRefused(LlmgwError):
    """The command cannot go on; the message says why and what to do. Exit code 1."""


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
    app.command("apply")(apply)


# ------------------------------------------------------------------------------------------------ options

PathArg = Annotated[Path, typer.Argument(help="Cluster repo directory (or one YAML file)")]
ControllerOpt = Annotated[
    str | None,
    typer.Option(
        "--controller",
        envvar=admin_client.CONTROLLER_ENV,
        help="Controller URL (https://host:port); needed whenever the token comes from --token-file or "
        "$LLMGW_TOKEN (default then: none; else the Cluster's controller.address when it is loopback)",
    ),
]
TokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        help=f"Admin token file (default: ${admin_client.TOKEN_ENV}, else the token a local controller made)",
    ),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        help="Revision to report and apply; default: the commit SHA of a clean checkout when the controller "
        "follows git, else the YAML content hash (as the controller's source names it)"
    ),
]

MirrorTokenOpt = Annotated[
    Path | None,
    typer.Option(
        "--mirror-token-file",
        help="Bearer token for the Cluster's mirror when it wants one (sent to the mirror only)",
    ),
]
SimulateOpt = Annotated[
    bool,
    typer.Option(
        "--simulate",
        help="Replay a trace against the current and the planned fleet; exit 3 on a regression past "
        "spec.plan.simulate, 4 when the bench's spread leaves it undecided (without --trace: a synthetic "
        "trace, docs/gitops.md)",
    ),
]
TraceOpt = Annotated[
    Path | None, typer.Option("--trace", help="The trace --simulate replays (`llmgw traffic export`)")
]
CapacityOpt = Annotated[
    Path | None,
    typer.Option(
        "--capacity",
        help="Measured capacity for --simulate (`llmgw capacity --json`); default: the controller's",
    ),
]
StateOpt = Annotated[
    Path | None,
    typer.Option(
        "--state",
        help="Plan against a saved live state (JSON, from --save-state: it holds the applied revision's "
        "documents) instead",
    ),
]
FormatOpt = Annotated[PlanFormat, typer.Option("--format", "-f", help="text, json, or markdown")]
OutOpt = Annotated[Path | None, typer.Option("--out", help="Save the plan for `llmgw apply PLANFILE`")]
SaveStateOpt = Annotated[
    Path | None, typer.Option("--save-state", help="Also write the live state taken to FILE (JSON)")
]
DetailedExitcodeOpt = Annotated[
    bool, typer.Option("--detailed-exitcode", help="Exit 0 no changes, 1 error, 2 changes")
]
OfflineOpt = Annotated[
    bool,
    typer.Option(
        "--offline",
        help="Ask no weights server: each new or changed source is listed as not checked",
    ),
]


# ------------------------------------------------------------------------------------------------ plan


def plan(
    path: PathArg = Path("."),
    controller: ControllerOpt = None,
    state: StateOpt = None,
    output: FormatOpt = PlanFormat.text,
    out: OutOpt = None,
    save_state: SaveStateOpt = None,
    detailed_exitcode: DetailedExitcodeOpt = False,
    token_file: TokenOpt = None,
    revision: RevisionOpt = None,
    offline: OfflineOpt = False,
    mirror_token_file: MirrorTokenOpt = None,
    usage_window: plan_usage.WindowOpt = "7d",
    impact_exitcode: plan_usage.ImpactExitOpt = False,
    simulate: SimulateOpt = False,
    trace: TraceOpt = None,
    capacity: CapacityOpt = None,
    bindings: BindingsOpt = None,
    suggest: plan_suggest.SuggestOpt = False,
    objective: plan_suggest.ObjectiveOpt = plan_suggest.ObjectiveChoice.cost,
    write: plan_suggest.WriteOpt = False,
    post: plan_suggest.PostOpt = False,
) -> None:
    """Show what applying the cluster repo would change in the fleet, and check that each new or changed
    weights source exists with the repo's sizes (and digests where the server names them)."""
    from llmgw.core import plan as plans

    result = _valid_repo(path, revision, bindings, output)
    assert result.repo is not None
    catalog = result.repo.catalog
    if state is not None:
        live, usage, source = _read_state(state, controller)
        client: AdminClient | None = None
    else:
        client = _client(controller, token_file, path, catalog.cluster.controller.address)
        live = client.state()
        usage = plan_usage.fetch_usage(client, usage_window)
        source = client.url
        named = None if revision is not None else revision_like_source(path, client.status())
        if named is not None:
            result = load_repo(path, revision=named)
            assert result.repo is not None
            catalog = result.repo.catalog
    if save_state is not None:
        plan_usage.write_state(save_state, live, usage)
    made = plan_usage.with_impact(plans.plan_for_catalog(catalog, live), usage, catalog, live)
    made = _with_sources(made, result, live, offline, mirror_token_file)
    if out is not None and not (made.source_errors or made.misfits):
        _write_plan_file(out, path, result, made, source)
    typer.echo(plans.render(made, output.value), nl=False)
    if made.source_errors or made.misfits:
        _refuse(made, saved=out is not None)
    if out is not None:
        typer.echo(f"Saved the plan to {out}; `llmgw apply {out}` applies exactly this.", err=True)
    asked = plan_suggest.Asked(objective, write, post) if suggest else None
    _suggest_and_simulate(result, live, made, Replayed(trace, capacity, client), output, asked, simulate)
    raise typer.Exit(plan_usage.exit_code(made, detailed=detailed_exitcode, impact=impact_exitcode))


class Replayed(NamedTuple):
    """What --suggest and --simulate replay: the trace, the capacity file, and the controller's client (None
    when the live state came from a file)."""

    trace: Path | None
    capacity: Path | None
    client: AdminClient | None


def _suggest_and_simulate(
    result: LoadResult,
    live: LiveState,
    made: Plan,
    inputs: Replayed,
    output: PlanFormat,
    asked: plan_suggest.Asked | None,
    simulate: bool,
) -> None:
    """`--suggest` (when `asked`), then `--simulate` (asked, or a trace without --suggest); exit 3 or 4 on
    --simulate's verdicts, then 4 when the suggestion is undecided."""
    trace, capacity, client = inputs
    assert result.repo is not None
    suggested = (
        plan_suggest.run(result, live, trace, capacity, client, output.value, asked) if asked else None
    )
    if simulate or (trace is not None and asked is None):
        _simulate(result.repo.catalog, live, made, trace, capacity, client, output)
    plan_suggest.undecided_exit(suggested)


def _valid_repo(path: Path, revision: str | None, bindings: Path | None, output: PlanFormat) -> LoadResult:
    """The repo, validated (with the operator's binding map when given), its warnings told; exit 1 when it is
    invalid. Warnings are e.g. a node serving on every address or a secret reference that needs a binding:
    reviewers see them on the plan too."""
    result = with_bindings(load_repo(path, revision=revision), bindings)
    if not result.ok or result.repo is None:
        _invalid(result, output)
        raise typer.Exit(1)
    for warning in result.warnings:
        typer.echo(warning.format_text(), err=True)
    return result


def _simulate(
    catalog: Any,
    live: LiveState,
    made: Plan,
    trace: Path | None,
    capacity: Path | None,
    client: Any,
    output: PlanFormat,
) -> None:
    """The `--simulate` section (llmgw/cli/repo/plan_simulate.py) after the plan: in a fenced block of the PR
    comment, on stderr beside JSON (stdout stays one document); exit 3 on a regression, 4 on a verdict the
    measured spread leaves undecided (and none certain)."""
    from llmgw.cli.repo import plan_simulate as sim

    try:
        measured = sim.fetch_measurements(capacity, client)
        result = sim.simulate(catalog, live, made, trace, measured)
    except (AdminError, sim.SimulateError) as exc:
        _fail(str(exc))
    if output is PlanFormat.markdown:
        typer.echo(f"\n#### Simulated serving\n\n```text{result.text}```")
    else:
        typer.echo(result.text, nl=False, err=output is PlanFormat.json)
    if result.regressions:
        typer.echo(f"error: the planned fleet regresses ({len(result.regressions)}); exit 3", err=True)
        raise typer.Exit(3)
    if result.undecided:  # neither a pass nor a failure: the measured spread cannot tell
        typer.echo(
            f"warning: undecided ({len(result.undecided)}): the interval straddles a threshold; exit 4",
            err=True,
        )
        raise typer.Exit(4)


def _refuse(made: Plan, *, saved: bool) -> NoReturn:
    """A wrong weights source or a profile that cannot fit: each on stderr where it is, then exit 1."""
    for verdict in made.source_errors:
        for problem in verdict.problems:
            typer.echo(f"{verdict.where}: spec.source: model {verdict.model}: {problem}", err=True)
    for fit in made.misfits:
        typer.echo(
            f"error: model {fit.model} profile {fit.profile} on {fit.gpu_class}: {fit.words()}", err=True
        )
    what = "a weights source is wrong" if made.source_errors else "a profile does not fit its GPUs"
    typer.echo(f"error: {what}" + ("; the plan was not saved" if saved else ""), err=True)
    raise typer.Exit(1)


def _with_sources(made: Plan, result: LoadResult, live: LiveState, offline: bool, token: Path | None) -> Plan:
    """The plan with a verdict on every new or changed weights source (llmgw.core.plan.source_check)."""
    import asyncio
    import dataclasses

    from llmgw.adapters.model_files import gguf_architecture_verdicts
    from llmgw.adapters.source_probe import check_sources
    from llmgw.core.plan.source_check import not_checked, to_check

    assert result.repo is not None
    catalog = result.repo.catalog
    items = to_check(catalog, _source_places(result), live.models, live.documents)
    if offline:
        verdicts = [not_checked(i, i.unchecked or "--offline: no server was asked") for i in items]
    else:
        mirror_token = _read_secret(token, "--mirror-token-file") if token is not None else None
        verdicts = asyncio.run(
            check_sources(items, mirror_url=catalog.cluster.mirror.url, mirror_token=mirror_token)
        )
        verdicts = asyncio.run(gguf_architecture_verdicts(catalog, verdicts))  # docs/engines.md, llamacpp
    return dataclasses.replace(made, sources=tuple(verdicts))


def _source_places(result: LoadResult) -> dict[str, str]:
    """Model name -> `file:line:col` of its spec.source, for the plan's source errors."""
    out: dict[str, str] = {}
    for doc in result.documents:
        if doc.kind == "Model":
            pos = doc.positions.value(("spec", "source"))
            line, col = (pos.line, pos.col) if pos else (1, 1)
            out[doc.name] = f"{doc.file}:{line}:{col}"
    return out


def _read_secret(path: Path, flag: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise CommandRefused(f"{flag} {path}: cannot read it: {exc.strerror or exc}") from exc


def _invalid(result: LoadResult, output: PlanFormat) -> None:
    """The validate output on stderr; for markdown also a short comment body on stdout, for the PR."""
    from llmgw.cli.repo import validate as v

    typer.echo(v.render(result, v.Format.text), nl=False, err=True)
    if output is PlanFormat.markdown:
        lines = ["### llmgw plan", "", f"**The cluster repo is invalid: {len(result.errors)} error(s).**", ""]
        lines += ["```text", *(e.format_text() for e in result.errors), "```"]
        typer.echo("\n".join(lines))
    elif output is PlanFormat.json:
        typer.echo(v.render(result, v.Format.json), nl=False)


def _read_state(path: Path, controller: str | None) -> tuple[LiveState, plan_usage.Usage | None, str]:
    """The saved live state, the usage saved with it, and the words naming where the state came from."""
    if controller is not None:
        raise CommandRefused("give --controller or --state, not both")
    try:
        live, usage = plan_usage.read_state(path)
    except plan_usage.BadState as exc:
        raise CommandRefused(str(exc)) from exc
    return live, usage, f"saved state {path}"


# ------------------------------------------------------------------------------------------------ plan files


def _write_plan_file(out: Path, path: Path, result: LoadResult, made: Any, source: str) -> None:
    from llmgw.core.plan import saved_plan

    assert result.repo is not None
    saved = saved_plan(
        made,
        repo_path=str(path.resolve()),
        repo_revision=result.repo.revision,
        repo_content_hash=_content_hash(path),
        live_source=source,
        created_at=time.time(),
    )
    out.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_plan_file(path: Path) -> dict[str, Any] | None:
    """The saved plan at `path`, or None when it is not a plan file (then it is a repo path)."""
    from llmgw.core.plan import parse_saved_plan

    if not path.is_file() or path.suffix in (".yaml", ".yml"):
        return None
    try:
        return parse_saved_plan(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def check_saved_plan(saved: dict[str, Any], result: LoadResult, live: LiveState) -> None:
    """core.plan's staleness rule over the repo directory as it is now (raises StalePlan)."""
    from llmgw.core.plan import check_plan_current

    assert result.repo is not None
    current = _content_hash(Path(saved["repo"]["path"]))
    check_plan_current(saved, repo_content_hash=current, catalog=result.repo.catalog, live=live)


def _content_hash(path: Path) -> str:
    from llmgw.adapters.repo_files import content_hash

    return content_hash(path)


# ------------------------------------------------------------------------------------------------ apply

TargetArg = Annotated[Path, typer.Argument(help="Cluster repo directory, or a plan file from `plan --out`")]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Follow until Synced and Healthy")]
TimeoutOpt = Annotated[str, typer.Option(help="How long --wait waits (e.g. 90s, 10m)")]
DegradedForOpt = Annotated[
    str, typer.Option(help="With --wait, give up once a model has been Degraded this long (0s: at once)")
]
SendOpt = Annotated[
    Send,
    typer.Option(
        help="How the repo reaches the controller: its path (a controller on this machine), its files, "
        "or auto (path for a loopback controller)"
    ),
]
IntervalOpt = Annotated[float, typer.Option(help="Seconds between status polls with --wait", hidden=True)]
ActorOpt = Annotated[
    str | None,
    typer.Option(
        "--actor",
        help="Who is applying, for the revision history beside the token's name (default: "
        "github-run:$GITHUB_RUN_ID in GitHub Actions, else user@host)",
    ),
]


def apply(
    target: TargetArg = Path("."),
    controller: ControllerOpt = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = "10m",
    degraded_for: DegradedForOpt = "30s",
    token_file: TokenOpt = None,
    revision: RevisionOpt = None,
    send: SendOpt = Send.auto,
    interval: IntervalOpt = 1.0,
    actor: ActorOpt = None,
) -> None:
    """Send the cluster repo (or a saved plan) to the controller; with --wait, follow it to Healthy."""
    from llmgw.controller.parts.settings import SettingsError, setting_duration

    try:
        limit_s = setting_duration("--timeout", timeout)
        degraded_s = setting_duration("--degraded-for", degraded_for)
    except SettingsError as exc:
        _fail(str(exc))
    saved = read_plan_file(target)
    path = Path(saved["repo"]["path"]) if saved else target
    if saved is not None and revision is None:
        revision = saved["repo"]["revision"]
    result = load_repo(path, revision=revision)
    if not result.ok or result.repo is None:
        from llmgw.cli.repo import validate as v

        typer.echo(v.render(result, v.Format.text), nl=False, err=True)
        typer.echo("Nothing was applied: the cluster repo is invalid.", err=True)
        raise typer.Exit(1)
    client = _client(controller, token_file, path, result.repo.catalog.cluster.controller.address)
    if revision is None and saved is None:
        named = revision_like_source(path, client.status())
        result = result if named is None else load_repo(path, revision=named)
    if saved is not None:
        check_saved_plan(saved, result, client.state())
    assert result.repo is not None
    rev = result.repo.revision or _content_hash(path)
    reply = _send(client, path, rev, send, actor or _actor(admin_client.environ()))
    _nudge(client)
    if reply.get("result") == "refused":
        _refused(rev, reply)
    # The controller names what it applied (an unverifiable label becomes apply:<content hash>): follow that.
    rev = str(reply.get("revision") or rev)
    word = {"applied": "applied", "unchanged": "already applied"}.get(str(reply.get("result")), "sent")
    typer.echo(f"Revision {short(rev)} {word} on {client.url}.")
    if not wait:
        raise typer.Exit(0)
    raise typer.Exit(follow.follow(client, rev, limit_s, interval, sys.stdout.isatty(), degraded_s))


def _refused(rev: str, reply: dict[str, Any]) -> NoReturn:
    """The controller's reasons for refusing `rev`, on stderr; exit 1."""
    errors = [str(e) for e in reply.get("errors", [])]
    typer.echo(f"The controller refused revision {short(rev)}:", err=True)
    for line in errors:
        typer.echo(f"  {line}", err=True)
    raise typer.Exit(1)


def revision_like_source(path: Path, status: dict[str, Any]) -> str | None:
    """The commit SHA of a clean git checkout at `path` when the controller follows git, else None (the
    content hash). Sync compares the applied revision with the source's, so both must name it the same way:
    a SHA for a git source, a content hash for a directory (`llmgw up`)."""
    seen = status.get("seen") or {}
    if not str(seen.get("source") or "").startswith("git "):
        return None
    import git

    try:
        with git.Repo(path if path.is_dir() else path.parent, search_parent_directories=True) as repo:
            if repo.is_dirty(untracked_files=True):
                return None  # what is applied is not a commit; its content hash says so
            return str(repo.head.commit.hexsha)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError, ValueError):
        return None


def _nudge(client: AdminClient) -> None:
    """Ask the controller to read its source now, so sync compares against the branch as it is."""
    with contextlib.suppress(AdminError):  # only a hint: the next poll does the same
        client.post("/api/v1/webhook", {}, ok=(200, 202))


def _actor(env: Any) -> str:
    """What the history records beside the token's name: the CI run, else the user and host."""
    run = str(env.get("GITHUB_RUN_ID", "")).strip()
    if run:
        repo = str(env.get("GITHUB_REPOSITORY", "")).strip()
        return f"github-run:{run}" + (f" ({repo})" if repo else "")
    return _who()


def _send(client: AdminClient, path: Path, revision: str, send: Send, actor: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {"revision": revision, "source": f"llmgw apply by {_who()}", "actor": actor}
    auto = send is Send.auto
    if auto:
        host = client.url.split("://", 1)[-1].rsplit(":", 1)[0]
        send = Send.path if host in LOOPBACK and path.is_dir() else Send.files
    if send is Send.path:
        body["path"] = str(path.resolve() if path.is_dir() else path.resolve().parent)
        if not path.is_dir():
            raise CommandRefused(
                "--send path needs a repo directory; use --send files for a single YAML file"
            )
    else:
        body["files"] = repo_files(path)
    try:
        status, reply = client.post("/api/v1/apply", body, ok=(200, 422))
    except AdminError as exc:
        # A local controller reads by path only inside its own repo (and its apply_paths): a checkout
        # elsewhere goes as files, as it would to a remote controller.
        if not (auto and "path" in body and _path_not_allowed(exc)):
            raise
        del body["path"]
        body["files"] = repo_files(path)
        status, reply = client.post("/api/v1/apply", body, ok=(200, 422))
    if not isinstance(reply, dict):
        raise CommandRefused(f"the controller answered {status} without a JSON object")
    return reply


def _path_not_allowed(exc: AdminError) -> bool:
    error = exc.body.get("error") if isinstance(exc.body, dict) else None
    return exc.status == 400 and isinstance(error, dict) and "allowed" in error


def repo_files(path: Path) -> dict[str, str]:
    """The YAML files the loader reads, by path relative to the repo (what `--send files` uploads)."""
    from llmgw.adapters.repo_files import yaml_files

    if path.is_file():
        return {path.name: path.read_text(encoding="utf-8")}
    return {str(p.relative_to(path)): p.read_text(encoding="utf-8") for p in yaml_files(path)}


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ------------------------------------------------------------------------------------------------ shared


def _client(controller: str | None, token_file: Path | None, repo: Path, declared: str) -> AdminClient:
    """The admin client: the token goes to the repo-declared address only when it is a local controller's
    own token and that address is loopback (admin_client.choose_controller)."""
    env = admin_client.environ()
    token = admin_client.resolve_token(
        token_file, env, admin_client.default_token_files(repo.resolve(), Path.cwd())
    )
    client = AdminClient(admin_client.choose_controller(controller, declared, token), token)
    warning = admin_client.plaintext_warning(client.url)
    if warning is not None:
        typer.echo(f"warning: {warning}", err=True)
    return client


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)
