"""`llmgw controller` (run it) and the read-only views of a running one: `status`, `nodes`, `replicas`,
`models`, `explain MODEL`. Each view prints a rich table, or the admin API's JSON with `--json`.

The controller is found at `--controller URL`, else $LLMGW_CONTROLLER, else http://127.0.0.1:7070 (the
Cluster document's default address); the admin token as llmgw.cli.admin_client resolves it.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from llmgw.cli import output
from llmgw.cli.output import HEALTH_STYLE
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client, fail
from llmgw.core.fleet.health import CLOCK_WARN_S
from llmgw.core.words import duration_words, short

if TYPE_CHECKING:
    from llmgw.controller.parts.settings import ControllerOptions

STATE_STYLE = {"Ready": "green", "ready": "green", "Unreachable": "yellow", "Lost": "red", "failed": "red"}


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)
    app.command("status")(status)
    app.command("nodes")(nodes)
    app.command("replicas")(replicas)
    app.command("models")(models)
    app.command("explain")(explain)


# ---------------------------------------------------------------------------------------------- run


# The flags of `llmgw controller`; each also a key of the --config file (the settings' names).
_RepoOpt = Annotated[str | None, typer.Option("--repo", help="Cluster repo: a git URL, or a path")]
_BranchOpt = Annotated[str | None, typer.Option("--branch", help="Branch to follow (default main)")]
_SubpathOpt = Annotated[str | None, typer.Option("--subpath", help="Directory of the repo holding the YAML")]
_PollOpt = Annotated[str | None, typer.Option("--poll", help="How often to fetch the remote, e.g. 30s")]
_SourceOpt = Annotated[str | None, typer.Option("--source", help="auto, git or directory")]
_StoreOpt = Annotated[
    str | None, typer.Option("--store", help="Store DSN: sqlite:///path, postgresql://..., @file")
]
_ListenOpt = Annotated[str | None, typer.Option("--listen", help="host:port for agents, routers, admin API")]
_MirrorDirOpt = Annotated[Path | None, typer.Option("--mirror-dir", help="Serve this weights mirror")]
_MirrorListenOpt = Annotated[str | None, typer.Option("--mirror-listen", help="host:port of the mirror")]
_MetricsListenOpt = Annotated[str | None, typer.Option("--metrics-listen", help="host:port of /metrics")]
_AdminTokenFileOpt = Annotated[
    Path | None, typer.Option("--admin-token-file", help="File with the admin token")
]
_AdminTokensFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--admin-tokens-file",
        help="YAML: more admin tokens, name -> {scope: plan|apply|admin, sha256: HEX | file: PATH}",
    ),
]
_StateDirOpt = Annotated[Path | None, typer.Option("--state-dir", help="Clone, generated secrets")]
_SecretsDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--secrets-dir", help="The repo's {file: NAME} secrets are read here (default STATE_DIR/secrets)"
    ),
]
_SecretEnvPrefixOpt = Annotated[
    str | None,
    typer.Option(
        "--secret-env-prefix", help="The repo's {env: NAME} secrets need this prefix (LLMGW_SECRET_)"
    ),
]
_TlsCertOpt = Annotated[Path | None, typer.Option("--tls-cert", help="Serve TLS with this certificate")]
_TlsKeyOpt = Annotated[Path | None, typer.Option("--tls-key", help="Key of --tls-cert")]
_TlsClientCaOpt = Annotated[
    Path | None, typer.Option("--tls-client-ca", help="Agents need a cert from this CA")
]
_CaDirOpt = Annotated[
    Path | None, typer.Option("--ca-dir", help="Cluster CA directory: TLS, node certificates required")
]
_InsecureTokenOnlyRemoteNodesOpt = Annotated[
    bool | None,
    typer.Option(
        "--insecure-token-only-remote-nodes",
        help="INSECURE: bootstrap remote Nodes with a bearer token in clear, no cluster CA",
    ),
]
_HaOpt = Annotated[
    bool | None,
    typer.Option("--ha/--no-ha", help="Share the store with other controllers: lead by lease, else stand by"),
]
_AdvertiseOpt = Annotated[
    str | None,
    typer.Option("--advertise", help="With --ha: the URL others are told to reach this one at"),
]
_ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML file of these settings (flags win)")]
_LogLevelOpt = Annotated[str, typer.Option("--log-level")]
_LogFormatOpt = Annotated[
    str | None, typer.Option("--log-format", help="text (default) or json: one JSON object per log line")
]


def controller(
    repo: _RepoOpt = None,
    branch: _BranchOpt = None,
    subpath: _SubpathOpt = None,
    poll: _PollOpt = None,
    source: _SourceOpt = None,
    store: _StoreOpt = None,
    listen: _ListenOpt = None,
    metrics_listen: _MetricsListenOpt = None,
    mirror_dir: _MirrorDirOpt = None,
    mirror_listen: _MirrorListenOpt = None,
    admin_token_file: _AdminTokenFileOpt = None,
    admin_tokens_file: _AdminTokensFileOpt = None,
    state_dir: _StateDirOpt = None,
    secrets_dir: _SecretsDirOpt = None,
    secret_env_prefix: _SecretEnvPrefixOpt = None,
    tls_cert: _TlsCertOpt = None,
    tls_key: _TlsKeyOpt = None,
    tls_client_ca: _TlsClientCaOpt = None,
    ca_dir: _CaDirOpt = None,
    insecure_token_only_remote_nodes: _InsecureTokenOnlyRemoteNodesOpt = None,
    ha: _HaOpt = None,
    advertise: _AdvertiseOpt = None,
    config: _ConfigOpt = None,
    log_level: _LogLevelOpt = "INFO",
    log_format: _LogFormatOpt = None,
) -> None:
    """Run the controller: follow the cluster repo, place replicas through agents, tell routers."""
    from llmgw.adapters import logformat
    from llmgw.controller.app import run_controller

    flags = {
        "repo": repo,
        "branch": branch,
        "subpath": subpath,
        "source": source,
        "store": store,
        "listen": listen,
        "metrics_listen": metrics_listen,
        "mirror_dir": mirror_dir,
        "mirror_listen": mirror_listen,
        "admin_token_file": admin_token_file,
        "admin_tokens_file": admin_tokens_file,
        "state_dir": state_dir,
        "secrets_dir": secrets_dir,
        "secret_env_prefix": secret_env_prefix,
        "tls_cert": tls_cert,
        "tls_key": tls_key,
        "tls_client_ca": tls_client_ca,
        "ca_dir": ca_dir,
        "insecure_token_only_remote_nodes": insecure_token_only_remote_nodes,
        "ha": ha,
        "advertise": advertise,
        "log_format": log_format,
    }
    settings = controller_settings(config, flags, poll)
    logformat.configure(log_level, settings.log_format)
    asyncio.run(_run_until_signal(run_controller, settings))


def controller_settings(config: Path | None, flags: dict[str, Any], poll: str | None) -> ControllerOptions:
    """The settings from the --config file with the flags given over it; a mistake exits with its message."""
    from pydantic import ValidationError

    from llmgw.controller.parts.settings import (
        ControllerOptions,
        SettingsError,
        load_settings_file,
        setting_duration,
    )

    try:
        values: dict[str, Any] = load_settings_file(config) if config else {}
        flags = {**flags, "poll_s": setting_duration("--poll", poll) if poll else None}
        values.update({k: v for k, v in flags.items() if v is not None})
        values.setdefault("store", "sqlite:///.llmgw/state/llmgw.db")
        if "repo" not in values:
            fail("--repo is required (a git URL, or a path to the cluster repo)")
        settings = ControllerOptions(**values)
        if settings.admin_tokens_file is not None:
            from llmgw.controller.parts.admin_tokens import check_tokens_file

            check_tokens_file(settings.admin_tokens_file)  # a mistake here is said now, not as a traceback
    except (SettingsError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            fail(f"controller setting {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        fail(str(exc))
    return settings


async def _run_until_signal(run: Any, settings: Any) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await run(settings, stop)


# ---------------------------------------------------------------------------------------------- views


def _styled(value: str, styles: dict[str, str]) -> str:
    style = styles.get(value)
    return f"[{style}]{value}[/{style}]" if style else value


def _ago(at: float | None) -> str:
    if not at:
        return "-"
    return duration_words(max(0.0, time.time() - at)) + " ago"


def status(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Applied revision, sync (Synced/OutOfSync) and every model's health."""
    data = controller_client(controller, token_file).get("/api/v1/status")
    if as_json:
        output.print_json(data)
        return
    console = output.console()
    _print_revision(console, data)
    _print_nodes(console, data)
    _print_leadership(console, data.get("leadership") or {})
    _print_repo_problems(console, data)
    console.print(_models_table(data))
    _print_capacity(console, data.get("capacity"))


def _print_revision(console: Any, data: dict[str, Any]) -> None:
    """The revision applied, and whether it is the one last seen in the repo."""
    applied, seen = data.get("applied"), data.get("seen")
    console.print(
        f"revision [bold]{short(applied and applied['revision'], missing='-')}[/bold] applied {_ago(applied and applied['applied_at'])}"
        f" from {applied['source'] if applied else '-'}",
        highlight=False,
    )
    sync = data.get("sync", "Unknown")
    console.print(
        f"sync     {_styled(sync, {'Synced': 'green', 'OutOfSync': 'yellow'})} (seen {short(seen and seen['revision'], missing='-')})",
        highlight=False,
    )


def _print_nodes(console: Any, data: dict[str, Any]) -> None:
    """The nodes by state, then each node the repo does not declare and each node condition."""
    nodes = data.get("nodes", {})
    console.print(
        f"nodes    {nodes.get('Ready', 0)} Ready, {nodes.get('Unreachable', 0)} Unreachable, {nodes.get('Lost', 0)} Lost"
    )
    for n in data.get("undeclared_nodes") or []:
        # What the controller will (and will not) do with a node the repo does not declare.
        label = "removing" if n.get("action") == "remove" else "undeclared"
        console.print(f"  [yellow]{label}[/yellow] {n['node']}: {n['message']}", highlight=False)
    for cond in data.get("node_conditions") or []:
        console.print(
            f"  [yellow]condition[/yellow] {cond['node']}: {condition_lines({'conditions': [cond]})[0]}",
            highlight=False,
        )


def _print_leadership(console: Any, lead: dict[str, Any]) -> None:
    """With several controllers (HA): this one's role and who leads."""
    if lead.get("ha"):
        where = lead.get("leader_address") or "unknown"
        console.print(f"role     {lead.get('role')} (leader: {where})", highlight=False)
        if lead.get("store_error"):
            console.print(f"[yellow]lease store error:[/yellow] {lead['store_error']}", highlight=False)


def _print_repo_problems(console: Any, data: dict[str, Any]) -> None:
    """The cluster repo out of reach, or its newest revision refused (with why)."""
    if data.get("source_error"):
        console.print(f"[yellow]cluster repo unavailable:[/yellow] {data['source_error']}", highlight=False)
    refused = data.get("refused")
    if refused:
        console.print(
            f"[red]revision {short(refused['revision'], missing='-')} refused[/red] ({len(refused['errors'])} error(s)):"
        )
        for line in refused["errors"]:
            console.print(f"  {line}", highlight=False, markup=False)


def _models_table(data: dict[str, Any]) -> Table:
    table = Table("MODEL", "HEALTH", "READY", "TARGET", "MIN/MAX", "MEMORY", "NOTE")
    for m in data.get("models", []):
        note = _model_note(m)
        table.add_row(
            m["model"],
            _styled(m["health"], HEALTH_STYLE),
            str(m["ready"]),
            str(m["target"]),
            f"{m['min']}/{m['max']}",
            memory_words(m.get("memory")),
            note,
        )
    return table


def _model_note(m: dict[str, Any]) -> str:
    """What a model's row says beyond the numbers: fetching, waiting, stale profiles, its canary, the autoscaler."""
    note = m.get("waiting") or ("; ".join(f"{n}: {w}" for n, w in m.get("unplaceable", {}).items()) or "")
    if m.get("stale_replicas"):
        note = f"{m['stale_replicas']} stale profile" + (f"; {note}" if note else "")
    fetching = "; ".join(fetch_words(f) for f in m.get("fetching") or [])
    note = "; ".join(w for w in (fetching, note) if w)
    canary = m.get("canary")
    if canary:  # in progress: what it waits for; decided: the verdict
        words = canary["waiting"] if canary["phase"] in ("running", "unknown") else canary["verdict"]
        note = "; ".join(w for w in (f"canary {canary['phase']}: {words}", note) if w)
    scaled = m.get("autoscale")
    if scaled:
        note = "; ".join(w for w in (note, scaled["reason"]) if w)
    return note


def _print_capacity(console: Any, cap: dict[str, Any] | None) -> None:
    """Fleet capacity at a glance (llmgw.controller.status.capacity): GPUs per class, cores, free nodes, idle."""
    if not cap:
        return
    rows = Table("CAPACITY", "TOTAL", "USED", "FREE", "USED BY CLASS")
    for klass, g in cap.get("gpus", {}).items():
        by = ", ".join(f"{k} {n}" for k, n in sorted(g["by_class"].items())) or "-"
        rows.add_row(f"gpu {klass}", str(g["total"]), str(g["used"]), str(g["free"]), by)
    cpu = cap.get("cpu_cores") or {}
    if cpu:
        by = ", ".join(f"{k} {n}" for k, n in sorted(cpu["by_class"].items())) or "-"
        unknown = f" (+{cpu['nodes_unknown']} node(s) unknown)" if cpu.get("nodes_unknown") else ""
        rows.add_row("cpu cores", f"{cpu['total']}{unknown}", str(cpu["used"]), str(cpu["free"]), by)
    console.print(rows)
    free = cap.get("free_nodes") or {}
    words = "; ".join(f"{fabric}: {', '.join(names)}" for fabric, names in sorted(free.items())) or "none"
    console.print(f"free whole nodes (by fabric): {words}", highlight=False)
    for model, why in (cap.get("unplaceable") or {}).items():
        reasons = "; ".join(f"{n}: {w}" for n, w in why["reasons"].items())
        console.print(f"  [yellow]cannot place[/yellow] {model}: {reasons}", highlight=False)
    idle = cap.get("replicas_by_idleness") or []
    if idle:
        table = Table("REPLICA", "MODEL", "IN FLIGHT", "IDLE FOR")
        for r in idle:
            inflight = "-" if r["inflight"] is None else str(r["inflight"])
            idle_for = "-" if r["idle_s"] is None else _duration(r["idle_s"])
            table.add_row(r["replica"], r["model"], inflight, idle_for)
        console.print(table)


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}h {s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m {s % 60}s" if s >= 60 else f"{s}s"


def nodes(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Nodes, their state (Ready/Unreachable/Lost), inventory and replicas."""
    data = controller_client(controller, token_file).get("/api/v1/nodes")
    if as_json:
        output.print_json(data)
        return
    table = Table(
        "NODE", "STATE", "AGENT", "SEEN", "CPU", "MEMORY", "DISK", "GPUS", "ENGINES", "REPLICAS", "BOOTSTRAP"
    )
    conditions: list[str] = []
    for n in data["nodes"]:
        inv = n.get("inventory") or {}
        mem = inv.get("memory_bytes")
        gpus = inv.get("gpus")
        engines = inv.get("engines")
        table.add_row(
            n["name"] + _undeclared_mark(n),
            _styled(n["state"], STATE_STYLE),
            n.get("agent_version") or "-",  # the version the agent said at its last Register; - before one
            "never" if n.get("last_seen_s") is None else duration_words(n["last_seen_s"]) + " ago",
            "?" if inv.get("cpu_cores") is None else str(inv["cpu_cores"]),
            "?" if mem is None else f"{mem / 1024**3:.0f} GiB",
            _cache_disk_words(inv),
            "?" if gpus is None else (", ".join(g.get("class") or "?" for g in gpus) or "none"),
            "?" if engines is None else ", ".join(sorted(engines)),
            str(len(n.get("replicas", []))),
            _node_ops_words(n),
        )
        conditions += [f"{n['name']}: {line}" for line in condition_lines(inv)]
        conditions += [
            f"{n['name']}: gpu {g['index']} left out: {g['unusable']}"
            for g in gpus or []
            if g.get("unusable")
        ]
        conditions += [f"{n['name']}: {line}" for line in clock_lines(n)]
    console = output.console()
    console.print(table)
    for line in conditions:
        console.print(f"[yellow]condition[/yellow] {line}", highlight=False, markup=False)


def _cache_disk_words(inv: dict[str, Any]) -> str:
    """Free of total on the weights cache's filesystem (free alone says nothing: 8 GB of 10 TB or of 10)."""
    disk = next((d for d in inv.get("disks") or [] if d.get("holds_cache")), None)
    if disk is None or disk.get("free_bytes") is None:
        return "?"
    total = disk.get("total_bytes")
    words = f"{disk['free_bytes'] / 1024**3:.0f}/{'?' if total is None else f'{total / 1024**3:.0f}'} GiB"
    return words + (" shared" if disk.get("shared") else "")


def clock_lines(node: dict[str, Any]) -> list[str]:
    """The node's clock, said only when it is a second or more off the controller's (NTP is not working)."""
    offset = node.get("clock_offset_s")
    if offset is None or abs(offset) < CLOCK_WARN_S:
        return []
    side = "ahead of" if offset > 0 else "behind"
    return [f"clock {abs(offset):.1f}s {side} the controller's: fix NTP (`llmgw doctor {node['name']}`)"]


def condition_lines(inv: dict[str, Any]) -> list[str]:
    """A node's conditions in words, each with the last line the failing command printed."""
    lines = []
    for c in inv.get("conditions") or []:
        tail = c.get("tail") or []
        lines.append(f"{c['type']} {c['engine']}: {c['message']}" + (f" | {tail[-1]}" if tail else ""))
    return lines


def _undeclared_mark(node: dict[str, Any]) -> str:
    if node.get("declared"):
        return ""
    return " (removing)" if node.get("if_undeclared") == "remove" else " (undeclared, kept)"


def _node_ops_words(node: dict[str, Any]) -> str:
    """The node's SSH bootstrap or removal in a few words (the message is what the operator acts on)."""
    removal, boot = node.get("removal"), node.get("bootstrap")
    if removal:
        return f"removal {removal['state']}: {removal['message']}"
    if not boot:
        return ""
    words = str(boot["state"]) + (
        f": {boot['message']}" if boot["state"] != "done" and boot["message"] else ""
    )
    if boot["state"] == "failed" and boot.get("retry_in_s") is not None:
        words += f" (retry in {boot['retry_in_s']:.0f}s)"
    return words


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024**3:.1f}"


def memory_words(memory: dict[str, Any] | None) -> str:
    """`1.2/4.0 GiB` (resident of reserved; `-` for what is unknown), and `GPU 10.3/80.0 GiB` when it has GPUs."""
    if not memory:
        return "-"
    rss, reserved = memory.get("rss_bytes"), memory.get("reserved_bytes")
    words = "-" if rss is None and reserved is None else f"{_gib(rss)}/{_gib(reserved)} GiB"
    if memory.get("gpu_reserved_bytes") is not None or memory.get("gpu_bytes") is not None:
        words += f", GPU {_gib(memory.get('gpu_bytes'))}/{_gib(memory.get('gpu_reserved_bytes'))} GiB"
    return words


def fetch_words(fetch: dict[str, Any]) -> str:
    """`fetching 40.1 MB of 1.3 GB` (bytes, as the agent counted them), or `fetching 40.1 MB so far` when the
    total is unknown: a percentage that stops moving is worse than a count that keeps rising."""
    done, total = fetch.get("bytes_done") or 0, fetch.get("bytes_total")
    words = f"fetching {_bytes(done)} of {_bytes(total)}" if total else f"fetching {_bytes(done)} so far"
    return words + (f" on {fetch['node']}" if fetch.get("node") else "")


def _bytes(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def replicas(
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
    model: Annotated[str | None, typer.Option("--model", help="Only this model's replicas")] = None,
) -> None:
    """Replicas: model, profile, node, state, adopted, stale profile."""
    path = "/api/v1/replicas" + (f"?model={model}" if model else "")
    data = controller_client(controller, token_file).get(path)
    if as_json:
        output.print_json(data)
        return
    table = Table("REPLICA", "MODEL", "PROFILE", "NODE", "STATE", "PID", "MEMORY", "NOTE")
    for r in data["replicas"]:
        notes = [w for w, on in (("adopted", r["adopted"]), ("stale profile", r["stale_profile"])) if on]
        notes += [fetch_words(f) for f in r.get("fetching") or []]
        if r.get("error"):
            notes.append(r["error"])
        table.add_row(
            r["id"],
            r["model"],
            r["profile"],
            ", ".join(r["nodes"]),
            _styled(r["state"], STATE_STYLE),
            str(r["pid"] or "-"),
            memory_words(r.get("memory")),
            "; ".join(notes),
        )
    output.console().print(table)


def models(controller: ControllerOpt = None, token_file: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Models of the applied revision with their health and profiles."""
    data = controller_client(controller, token_file).get("/api/v1/models")
    if as_json:
        output.print_json(data)
        return
    table = Table("MODEL", "ALIASES", "HEALTH", "READY", "MIN/MAX", "PROFILES", "FALLBACKS")
    for m in data["models"]:
        table.add_row(
            m["model"],
            ", ".join(m["aliases"]),
            _styled(m["health"], HEALTH_STYLE),
            f"{m['ready']}/{m['target']}",
            f"{m['min']}/{m['max']}",
            ", ".join(f"{p['name']} ({p['engine']})" for p in m["profiles"]) or (m.get("provider") or "-"),
            ", ".join(m["fallbacks"]),
        )
    output.console().print(table)


def explain(
    model: Annotated[str, typer.Argument(help="Model name or alias")],
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Where one more replica of MODEL would go, and why every other node would not take it."""
    client = controller_client(controller, token_file)
    data = client.explain(model)
    if data is None:
        fail(f"model {model!r} is not in the applied revision (llmgw models lists them)")
    if as_json:
        output.print_json(data)
        return
    console = output.console()
    health = data["health"]
    console.print(
        f"[bold]{data['model']}[/bold] {_styled(health['health'], HEALTH_STYLE)}: "
        f"{health['ready']} ready of {health['target']}",
        highlight=False,
    )
    if data.get("problem"):
        console.print(data["problem"])
    for role, pool in (data.get("pools") or {}).items():  # a disaggregated model: its two pools
        h = pool["health"]
        console.print(f"{role} pool {pool['model']}: {h['ready']} ready of {h['target']} ({h['health']})")
    chosen = data.get("would_place")
    if chosen:
        console.print(
            f"one more would go to {', '.join(chosen['nodes'])} ({chosen['profile']}): {chosen['why']}"
        )
    else:
        console.print("[red]no node can take one more replica[/red]")
    for profile in data["profiles"]:
        table = Table("NODE", "FITS", "WHY", title=f"profile {profile['profile']}: {profile['summary']}")
        for v in profile["nodes"]:
            table.add_row(v["node"], "[green]yes[/green]" if v["accepted"] else "[red]no[/red]", v["words"])
        console.print(table)
