"""`llmgw up`: the controller, a router and one local agent on this machine, from a cluster repo directory.

The controller and the router run in this process (one event loop); the agent runs as a child process in its
own session, so a Ctrl-C at the terminal reaches only `up`, which then stops everything in order:

1. the router (no new requests), 2. the controller (no new starts; commands in flight end),
3. the agent (SIGTERM; engines outlive an agent by design), 4. the engines the agent recorded in its state
dir, through the agent's own supervisor (SIGTERM to each engine's process group, SIGKILL after the grace).

State lives under one directory (default `.llmgw`), laid out so the other commands find it with no flags
when run from the same working directory: the store at `state/llmgw.db` (the store's default DSN), the
controller's admin token at `controller/admin-token` (where `llmgw plan/apply/status` look), the local
node's own token at `controller/node-token` (the agent's credential; the router is given the router token in
memory, and neither holds the admin token), the agent's state at `agent/`, the example key at `up/api-key`
(mode 0600; reused by the next `up`), and the content key what projects keep is sealed under at
`up/content-key` (the same). `up/lock` keeps a second `up` off the same state dir; `up/agent.pid` lets the
next `up` stop an agent a killed `up` left behind (its engines are then adopted by the new agent, not
restarted).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from llmgw.adapters.repo_files import load_repo
from llmgw.adapters.secrets import write_starter_bindings
from llmgw.adapters.tracing import configured_endpoint
from llmgw.cli.deploy.up_processes import (
    LLAMACPP_VERSION,
    UpError,
    UpSettings,
    agent_argv,
    hold_state_dir,
    llamacpp_binary,
    start_agent,
    stop_agent,
    stop_engines,
    stop_orphan_agent,
    tail,
    write_private,
)
from llmgw.cli.repo.follow import ModelLine
from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.console.sessions import ONE_TIME_LINK_S
from llmgw.controller.parts.settings import ControllerOptions
from llmgw.core.config.models import ClusterSpec
from llmgw.core.config.secret_bindings import SecretBindingError
from llmgw.core.config.secretrefs import SecretPolicy, read_bindings
from llmgw.core.desired.binding_report import binding_report
from llmgw.core.desired.repo import LoadResult
from llmgw.core.words import short

AGENT_PID_FILE = Path("up") / "agent.pid"
PROGRESS_EVERY_S = 0.5


@dataclass(frozen=True)
class RepoFacts:
    """What `up` needs from a valid repo: cluster settings, the local node, the example project."""

    cluster: ClusterSpec
    local_node: str
    project: str | None
    revision: str
    example_model: str  # for the printed examples: a real (non-sim) model when the repo has one


def repo_facts(result: LoadResult) -> RepoFacts:
    """The facts from a validated repo; UpError saying what to add when the local node is missing."""
    assert result.repo is not None
    cluster = ClusterSpec()
    local: str | None = None
    project: str | None = None
    for doc in result.repo.documents:
        spec: Any = getattr(doc.document, "spec", None)
        if doc.kind == "Cluster":
            cluster = spec
        elif doc.kind == "Node" and local is None and getattr(spec, "local", False):
            local = doc.name
        elif doc.kind == "Project" and project is None:
            project = doc.name
    if local is None:
        raise UpError(
            f"{result.repo.root}: no Node document has `spec.local: true`; `llmgw up` runs its agent as that "
            "node (add e.g. nodes/local.yaml: kind: Node, metadata.name: local, spec.local: true)"
        )
    models = result.repo.catalog.models
    real = [n for n, m in sorted(models.items()) if any(p.profile.engine != "sim" for p in m.profiles)]
    example = (real or sorted(models) or ["MODEL"])[0]
    return RepoFacts(cluster, local, project, result.repo.revision or "", example)


# ---------------------------------------------------------------------------------------------- progress


def fetch_detail(done: int | None, total: int | None) -> str:
    """Weights fetch progress in steps of 10% (a line per step, not per chunk); "" when none reported."""
    if done is None:
        return ""
    if not total:
        return f"fetching weights: {done // 1_000_000} MB"
    percent = min(100, int(done * 100 / total) // 10 * 10)
    return f"fetching weights: {percent}% of {total // 1_000_000} MB"


def replica_detail(states: Sequence[str], fetches: Sequence[str], errors: Sequence[str]) -> str:
    """Words for the replicas of a model that are not ready yet."""
    parts = list(dict.fromkeys(f for f in fetches if f))
    waiting = [s for s in states if s != "ready"]
    if waiting and not parts:
        counts = {s: waiting.count(s) for s in dict.fromkeys(waiting)}
        parts.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    parts.extend(dict.fromkeys(e.splitlines()[0][:160] for e in errors if e))
    return "; ".join(parts)


def model_lines(running: RunningController) -> list[ModelLine]:
    """The model lines of the controller running in this process (read on its event loop)."""
    from llmgw.controller.status import fleet as views

    c = running.controller
    if c.desired is None:
        return []
    out: list[ModelLine] = []
    for name in sorted(c.desired.models):
        health = views.model_health(c, name)
        states: list[str] = []
        fetches: list[str] = []
        errors: list[str] = []
        for rec in c.replicas.values():
            if rec.model != name:
                continue
            view = views.replica_json(c, rec)
            states.append(str(view["state"]))
            errors.append(str(view["error"]))
            shard = views.shard_status(c, rec)
            if shard is not None and shard.state != "ready":
                fetches.append(fetch_detail(shard.fetch_bytes_done, shard.fetch_bytes_total))
        detail = replica_detail(states, fetches, errors) if health["health"] != "Healthy" else ""
        if not detail and health["unplaceable"]:
            detail = "not placed: " + "; ".join(f"{k}: {v}" for k, v in health["unplaceable"].items())
        out.append(
            ModelLine(name, str(health["health"]), int(health["ready"]), int(health["target"]), detail)
        )
    return out


@dataclass
class ProgressLog:
    """Prints a line when something changed: nodes, revisions, each model's line; nothing otherwise."""

    out: TextIO
    shown: dict[str, str] = field(default_factory=dict)

    def say(self, key: str, line: str) -> None:
        if self.shown.get(key) == line:
            return
        self.shown[key] = line
        stamp = time.strftime("%H:%M:%S")
        print(f"[{stamp}] {line}", file=self.out, flush=True)

    def update(self, running: RunningController) -> None:
        c = running.controller
        if c.desired is not None:
            self.say("revision", f"revision {short(c.desired.revision)} applied from {c.desired.source}")
        for name, link in sorted(c.hub.nodes.items()):
            self.say(f"node:{name}", f"node {name}: {link.state}")
        if not c.hub.nodes:  # "not placed: no node has been seen" would only alarm while the agent connects
            self.say("waiting", "waiting for the local agent to connect")
            return
        lines = model_lines(running)
        for line in lines:
            self.say(f"model:{line.name}", line.render())
        if bool(lines) and all(line.health == "Healthy" for line in lines):
            self.say("healthy", f"all {len(lines)} models Healthy")
        else:
            self.shown.pop("healthy", None)  # said again when they are all Healthy again


# ---------------------------------------------------------------------------------------------- key


async def ensure_key(dsn: str, key_file: Path, project: str, now: float) -> tuple[str, bool]:
    """The example project's key: the one in `key_file` while the store still accepts it for `project`,
    else a new one written there (0600). Returns (plaintext, created)."""
    from llmgw.adapters import keys
    from llmgw.store import Store

    kept = _read_key(key_file)
    store = await Store.open(dsn)
    try:
        if kept is not None:
            found = await keys.lookup(store, kept, now)
            alive = found is not None and (found.expires_at is None or found.expires_at > now)
            if found is not None and alive and found.project == project and found.state == "active":
                return kept, False
        new = await keys.create_key(store, project, now, name="llmgw up")
    finally:
        await store.close()
    _write_key(key_file, new.plaintext)
    return new.plaintext, True


def _read_key(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


def _write_key(path: Path, plaintext: str) -> None:
    """Written 0600 from the start (never world-readable, not even for a moment), then renamed in place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(plaintext + "\n")
    os.replace(tmp, path)


def admin_hint(settings: UpSettings, controller_url: str, default_address: str, cwd: Path) -> str:
    """How `llmgw status`/`plan` reach this controller: no flags when the token and address are the defaults."""
    from llmgw.cli.admin_client import DEFAULT_STATE_DIR, controller_url as url_of

    token = settings.controller_dir / "admin-token"
    flags = []
    if url_of(default_address) != controller_url:
        flags.append(f"--controller {controller_url}")
    if (cwd / DEFAULT_STATE_DIR).resolve() != settings.controller_dir.resolve():
        flags.append(f"--token-file {token}")
    if not flags:
        return "`llmgw status` and `llmgw plan` work from this directory with no flags"
    return f"`llmgw status` and `llmgw plan` need {' '.join(flags)}"


def console_text(running: RunningController) -> str:
    """The console's URL on a line of its own, then a one-time login link for the local admin."""
    admin = running.controller.admin_tokens.principal(running.admin_token)
    assert admin is not None  # the controller's own token is always its `admin`
    nonce = running.console.sessions.one_time_link(admin)
    minutes = int(ONE_TIME_LINK_S // 60)
    return (
        f"console: {running.url}/ui/\n"
        f"  (log in once, within {minutes} minutes, with {running.url}/ui/login/once/{nonce}; "
        "after that with the admin token)"
    )


def usage_text(base_url: str, key: str, project: str, model: str, hint: str) -> str:
    """What to paste: the environment, a curl and the openai client."""
    body = f'{{"model": "{model}", "messages": [{{"role": "user", "content": "Say hello"}}]}}'
    return f"""
OpenAI base URL: {base_url}
API key (project {project}): {key}

  export OPENAI_BASE_URL={base_url} OPENAI_API_KEY={key}

  curl -s {base_url}/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \\
    -H "Content-Type: application/json" -d {shlex.quote(body)}

  python -c 'from openai import OpenAI; c = OpenAI(); print(c.chat.completions.create(model="{model}", messages=[{{"role": "user", "content": "Say hello"}}]).choices[0].message.content)'

(OpenAI() reads OPENAI_BASE_URL and OPENAI_API_KEY; {hint}.)
"""


# ---------------------------------------------------------------------------------------------- router


@dataclass
class LocalRouter:
    """The router running in this process, fed by the controller's stream, keys and usage in the store."""

    base_url: str
    metrics_url: str
    close: Callable[[], Awaitable[Any]]


async def start_router(
    listen: str,
    metrics_listen: str,
    controller_url: str,
    token: str,
    dsn: str,
    secrets: SecretPolicy | None = None,
    usage_spool: Path | None = None,
    grace_ledger: Path | None = None,
    content_key: bytes | None = None,
) -> LocalRouter:
    from llmgw_router.app import build_router, serve
    from llmgw_router.options import RouterOptions

    # $OTEL_EXPORTER_OTLP_ENDPOINT traces `llmgw up`'s router as it does its controller (docs/operations.md).
    options = RouterOptions(router_id="llmgw-up", otlp_endpoint=configured_endpoint(None))
    if secrets is not None:
        options = dataclasses.replace(options, secrets=secrets)
    stack = contextlib.AsyncExitStack()
    try:
        built = await build_router(
            stack,
            options,
            store=dsn,
            controllers=[controller_url],
            token=token,
            usage_spool=usage_spool,
            grace_ledger=grace_ledger,
            content_key=content_key,
        )
        listeners = await serve(built.service, listen, metrics_listen, built.link)
        stack.push_async_callback(listeners.close)
    except BaseException:
        await stack.aclose()
        raise
    host = listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
    mhost = metrics_listen.rpartition(":")[0].strip("[]") or "127.0.0.1"
    return LocalRouter(
        f"http://{_url_host(host)}:{listeners.api_port}/v1",
        f"http://{_url_host(mhost)}:{listeners.metrics_port}/metrics",
        stack.aclose,
    )


def _content_key(path: Path | None) -> bytes | None:
    """The controller's content key, for the router beside it (the controller read the file at its start)."""
    from llmgw.store.queries.content import parse_content_key

    return (
        None
        if path is None
        else parse_content_key(path.read_text(encoding="utf-8"), f"content_key_file {path}")
    )


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


# ---------------------------------------------------------------------------------------------- up


def run_up(settings: UpSettings, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Validate, start everything, show progress until SIGINT/SIGTERM, stop everything. The exit code."""
    from llmgw.cli.repo.validate import Format, render

    # Warnings of the parts (a refused revision with its errors, an engine that failed) go to `err` in the
    # progress lines' format; their info chatter stays out of a newcomer's terminal.
    logging.basicConfig(
        level=logging.WARNING, format="[%(asctime)s] %(name)s: %(message)s", datefmt="%H:%M:%S", stream=err
    )
    result = load_repo(settings.repo)
    if not result.ok:
        err.write(render(result, Format.text))
        return 1
    _binding_map(settings, result, err)
    try:
        facts = repo_facts(result)
        return asyncio.run(_up(settings, facts, out, err))
    except UpError as exc:
        print(f"llmgw up: {exc}", file=err)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the handlers were in place: nothing was started yet
        return 130


def _binding_map(settings: UpSettings, result: LoadResult, err: TextIO) -> None:
    """The secrets directory's binding map: a commented empty one the first time (the example names no secret
    that is sent anywhere), and each reference it does not allow told with its line. Never bound for the
    operator: that is the decision the map exists for."""
    write_starter_bindings(settings.secrets_dir)
    assert result.repo is not None
    try:
        found = binding_report(result.repo, read_bindings(SecretPolicy(settings.secrets_dir).bindings_file))
    except SecretBindingError as exc:
        print(f"llmgw up: {exc}", file=err)
        return
    for problem in found:
        print(problem.format_text(), file=err)


@dataclass
class Parts:
    """What `up` started, each None until it is; `shutdown` stops them in a fixed order."""

    controller: RunningController | None = None
    router: LocalRouter | None = None
    agent: subprocess.Popen[bytes] | None = None


async def _up(settings: UpSettings, facts: RepoFacts, out: TextIO, err: TextIO) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    (settings.state_dir / "state").mkdir(parents=True, exist_ok=True)
    lock = hold_state_dir(settings.state_dir)
    orphan = await asyncio.to_thread(
        stop_orphan_agent, settings.state_dir / AGENT_PID_FILE, settings.agent_dir
    )
    if orphan is not None:
        print(f"stopped the agent (pid {orphan}) an earlier `llmgw up` left running", file=out)
    parts = Parts()
    try:
        running = parts.controller = await _start_controller(settings, facts.cluster)
        print(
            f"controller: {running.url} (metrics {running.metrics_url or 'off'}), following {settings.repo}",
            file=out,
        )
        router = parts.router = await _start_router(settings, facts.cluster, running)
        print(f"router: {router.base_url} (metrics {router.metrics_url})", file=out)
        running.console.router_url = router.base_url  # the console's chat page talks through this router
        print(console_text(running), file=out)
        if facts.project is not None:
            key, created = await ensure_key(settings.store_dsn, settings.key_file, facts.project, time.time())
            hint = admin_hint(settings, running.url, facts.cluster.controller.address, Path.cwd())
            print(usage_text(router.base_url, key, facts.project, facts.example_model, hint), file=out)
            how = "created" if created else "reused"
            print(f"(key {how}; kept in {settings.key_file}, mode 0600)", file=out)
        else:
            print(
                "no Project in the repo, so no key: add one, then `llmgw keys create --project PROJECT`",
                file=out,
            )
        llamacpp = llamacpp_binary() if settings.llamacpp else None
        # The agent gets its node's own token, not the admin token: it opens the hub for this node only.
        node_token_file = write_private(
            settings.controller_dir / "node-token", running.controller.node_token(facts.local_node)
        )
        argv = agent_argv(settings, facts.local_node, running.url, node_token_file, llamacpp)
        agent_log = settings.agent_dir / "agent.log"
        parts.agent = start_agent(argv, agent_log)
        (settings.state_dir / AGENT_PID_FILE).write_text(f"{parts.agent.pid}\n", encoding="ascii")
        print(
            f"agent: node {facts.local_node}, pid {parts.agent.pid}, engines {_engines_text(settings, llamacpp)}; log {agent_log}",
            file=out,
        )
        print("Ctrl-C stops everything.", file=out, flush=True)
        return await _watch(running, parts.agent, agent_log, stop, out, err)
    finally:
        await shutdown(parts, settings.agent_dir, out)
        (settings.state_dir / AGENT_PID_FILE).unlink(missing_ok=True)
        lock.close()


def up_content_key(state_dir: Path) -> Path:
    """The content key `up` seals kept content under (stored responses, kept bodies), made at `up/content-key`
    (mode 0600) on the first run and the same one ever after, so what a project keeps opens after a restart."""
    path = state_dir / "up" / "content-key"
    if not path.exists():
        write_private(path, base64.b64encode(os.urandom(32)).decode())
    return path


async def _start_controller(settings: UpSettings, cluster: ClusterSpec) -> RunningController:
    controller_settings = ControllerOptions(
        repo=str(settings.repo),
        source="directory",
        store=settings.store_dsn,
        listen=settings.controller_listen or cluster.controller.address,
        metrics_listen=settings.controller_metrics_listen or cluster.controller.metrics_listen,
        state_dir=settings.controller_dir,
        # The local agent and router dial the controller over loopback without certificates, so `up` serves
        # no TLS; a remote Node it is asked to bootstrap over a network is then refused (its token would
        # cross in clear) unless the operator says --insecure-token-only-remote-nodes.
        default_ca=False,
        insecure_token_only_remote_nodes=settings.insecure_token_only_remote_nodes,
        secrets_dir=settings.secrets_dir,
        content_key_file=up_content_key(settings.state_dir),
    )
    try:
        return await start_controller(controller_settings)
    except OSError as exc:
        raise UpError(
            f"cannot start the controller on {controller_settings.listen}: {exc.strerror or exc} (another "
            "`llmgw up` or controller running? --controller-listen and --controller-metrics-listen pick others)"
        ) from exc


async def _start_router(
    settings: UpSettings, cluster: ClusterSpec, running: RunningController
) -> LocalRouter:
    listen = settings.router_listen or cluster.router.listen
    metrics = settings.router_metrics_listen or cluster.router.metrics_listen
    try:
        return await start_router(
            listen,
            metrics,
            running.url,
            running.controller.router_token(),  # a router's credential, not the admin token
            settings.store_dsn,
            running.controller.settings.secret_policy(),  # one directory for the controller and router
            (settings.router_dir / "usage-spool").absolute(),
            (settings.router_dir / "grace.jsonl").absolute(),
            _content_key(running.controller.settings.content_key_file),  # stored responses, as the controller
        )
    except OSError as exc:
        raise UpError(
            f"cannot start the router on {listen} (metrics {metrics}): {exc.strerror or exc} "
            "(--router-listen and --router-metrics-listen pick others)"
        ) from exc


def _engines_text(settings: UpSettings, llamacpp: str | None) -> str:
    if not settings.llamacpp:
        return "sim (--no-llamacpp)"
    if llamacpp is None:
        return "sim (llama.cpp is not installed: `make llamacpp`)"
    return f"llamacpp {LLAMACPP_VERSION} ({llamacpp}), sim"


async def shutdown(parts: Parts, agent_state: Path, out: TextIO) -> None:
    """Router first (no new requests), then the controller (no new starts, commands in flight end), then the
    agent, then the engines it recorded. Each step runs even when an earlier one failed."""
    if parts.router is not None:
        await _step(out, "router stopped", parts.router.close)
    if parts.controller is not None:
        await _step(out, "controller stopped", parts.controller.stop)
    if parts.agent is not None:
        agent = parts.agent
        await _step(out, "agent stopped", lambda: stop_agent(agent))
    count = await stop_engines(agent_state)
    print(f"engines stopped: {count}", file=out, flush=True)


async def _step(out: TextIO, what: str, fn: Callable[[], Awaitable[Any]]) -> None:
    try:
        await fn()
    except Exception as exc:  # the next steps must still run: an engine left behind is worse than a message
        print(f"{what.split()[0]}: stopping failed: {exc}", file=out, flush=True)
        return
    print(what, file=out, flush=True)


async def _watch(
    running: RunningController,
    agent: subprocess.Popen[bytes],
    agent_log: Path,
    stop: asyncio.Event,
    out: TextIO,
    err: TextIO,
) -> int:
    progress = ProgressLog(out)
    while not stop.is_set():
        progress.update(running)
        if agent.poll() is not None:
            print(
                f"llmgw up: the agent exited ({agent.returncode}); its last lines:\n{tail(agent_log)}",
                file=err,
                flush=True,
            )
            return 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PROGRESS_EVERY_S):  # not wait_for: on 3.11 it can swallow a Ctrl-C
                await stop.wait()
    print("stopping: router, controller, agent, engines", file=out, flush=True)
    return 0
