"""`llmgw upgrade --control-plane`: move the controllers and routers to another release, one at a time.

The plan file says what the control plane is: each controller and router with the URL it answers on and the
command that restarts it on a release (`{release}` in it is replaced: a systemd unit's drop-in, an `ssh host ...`,
anything that returns once the old process is gone and the new one started), how a release's own `llmgw` is run,
and the store. A small state file beside it remembers the release running now and the one before (`--rollback`).

The order: standby controllers first, then the leader (its SIGTERM releases the lease, so a standby already on
the new release leads at its next try), then the routers one at a time, each waited for on its /ready and then
for `lb_settle_s` (the load balancer's check interval x rise) before the next: a router drains on SIGTERM
(`llmgw-router --drain-delay`), so the balancer has stopped sending to it before it stops listening.

The store goes first: each release says which migrations it ships and which can be undone (`llmgw store
migrations --json`). Crossing a migration that cannot be undone is refused unless --allow-irreversible, before
anything restarts; going back below migrations the store has runs the newer release's `store migrate --down-to`
first. New migrations are applied by the first process of the new release that starts (every process migrates).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.cli import output
from llmgw.cli.admin_client import probe_status
from llmgw.store import Store, StoreError

Role = Literal["standby", "leader", "router"]


class Member(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    url: str = Field(
        description="http(s)://host:port it answers on (/healthz, /healthz/leader; a router /ready)"
    )
    restart: list[str] = Field(min_length=1, description="Restarts it on {release}; returns once it started")


class ControlPlanePlan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    store: str = Field(description="The store's DSN (or @file): its schema version is checked first")
    llmgw: list[str] = Field(min_length=1, description="How a release's llmgw is run, {release} replaced")
    release: str = Field(description="The release running before the first upgrade (later: the state file)")
    state_file: Path | None = Field(None, description="Default: the plan's path with .state.json")
    controllers: list[Member] = Field(default_factory=list)
    routers: list[Member] = Field(default_factory=list)
    ready_timeout_s: float = Field(120.0, gt=0)
    restart_timeout_s: float = Field(300.0, gt=0, description="How long a restart command may take")
    lb_settle_s: float = Field(0.0, ge=0, description="After a router is ready, before the next one drains")


@dataclass(frozen=True)
class MigrationInfo:
    version: int
    name: str
    reversible: bool


@dataclass(frozen=True)
class StoreStep:
    """What the store needs before the processes move: undo down to a version (with the running release's
    llmgw), or nothing; `refusal` when the move must not happen."""

    down_to: int | None
    crossing: list[MigrationInfo]
    refusal: str | None


def store_step(
    have: int, running: list[MigrationInfo], target: list[MigrationInfo], *, allow_irreversible: bool
) -> StoreStep:
    """Decide the store's part of moving from the `running` release to `target` with the store at `have`."""
    target_top = max((m.version for m in target), default=0)
    if target_top < have:
        undo = [m for m in running if target_top < m.version <= have]
        known = {m.version for m in undo}
        missing = [v for v in range(target_top + 1, have + 1) if v not in known]
        stuck = [f"{m.version:04d} {m.name}" for m in undo if not m.reversible] + [
            f"{v:04d}" for v in missing
        ]
        if stuck:
            return StoreStep(
                None,
                undo,
                f"the store has migrations the target release does not know and that "
                f"cannot be undone: {', '.join(stuck)}; restore a backup taken before them instead",
            )
        return StoreStep(target_top, undo, None)
    crossing = [m for m in target if m.version > have]
    one_way = [f"{m.version:04d} {m.name}" for m in crossing if not m.reversible]
    if one_way and not allow_irreversible:
        return StoreStep(
            None,
            crossing,
            (
                f"the target release migrates the store across {', '.join(one_way)}, which cannot be undone "
                "(no .down.sql): a --rollback would then be refused. Take a backup (`llmgw store backup`) and "
                "give --allow-irreversible to go on"
            ),
        )
    return StoreStep(None, crossing, None)


def order(
    controllers: list[Member], leading: dict[str, bool], routers: list[Member]
) -> list[tuple[Role, Member]]:
    """Standbys first, the leader last of the controllers (at most one leads), then the routers in turn."""
    standbys = [c for c in controllers if not leading.get(c.name)]
    leaders = [c for c in controllers if leading.get(c.name)]
    return (
        [("standby", c) for c in standbys]
        + [("leader", c) for c in leaders]
        + [("router", r) for r in routers]
    )


# ---------------------------------------------------------------------------------------------- the shell


def load_plan(path: Path) -> ControlPlanePlan:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return ControlPlanePlan.model_validate(raw)
    except OSError as exc:
        output.fail(f"--plan {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        output.fail(f"--plan {path}: not YAML: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        output.fail(f"--plan {path}: {'.'.join(str(p) for p in first['loc'])}: {first['msg']}")


def _state_path(plan: ControlPlanePlan, plan_path: Path) -> Path:
    return plan.state_file or plan_path.with_suffix(".state.json")


def read_state(plan: ControlPlanePlan, plan_path: Path) -> dict[str, str | None]:
    """{"current": release running, "previous": the one before it (None before the first upgrade)}."""
    path = _state_path(plan, plan_path)
    if not path.exists():
        return {"current": plan.release, "previous": None}
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        output.fail(f"the control plane's state file {path}: {exc}")
    return {"current": state.get("current"), "previous": state.get("previous")}


def _write_state(plan: ControlPlanePlan, plan_path: Path, current: str, previous: str) -> None:
    path = _state_path(plan, plan_path)
    temp = path.with_name(path.name + ".part")
    temp.write_text(json.dumps({"current": current, "previous": previous, "at": time.time()}) + "\n")
    temp.replace(path)


def _filled(argv: list[str], release: str) -> list[str]:
    return [a.replace("{release}", release) for a in argv]


def release_migrations(plan: ControlPlanePlan, release: str) -> list[MigrationInfo]:
    """What `release` ships, asked of its own llmgw (`store migrations --json`)."""
    argv = [*_filled(plan.llmgw, release), "store", "migrations", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        output.fail(f"release {release}: `{' '.join(argv)}` failed: {done.stderr.strip()[-1500:]}")
    try:
        return [
            MigrationInfo(int(m["version"]), str(m["name"]), bool(m["reversible"]))
            for m in json.loads(done.stdout)
        ]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        output.fail(f"release {release}: `store migrations --json` answered no list of migrations ({exc})")


def store_version(dsn: str) -> int:
    async def go() -> int:
        opened = await Store.open(dsn, migrate_schema=False)
        try:
            return await opened.schema_version()
        finally:
            await opened.close()

    try:
        return asyncio.run(go())
    except StoreError as exc:
        output.fail(f"the plan's store: {exc}")


def wait_status(url: str, want: int, limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while probe_status(url) != want:
        if time.monotonic() > deadline:
            output.fail(f"{what}: {url} did not answer {want} within {limit_s:.0f}s; the roll stops here")
        time.sleep(0.2)


def restart(member: Member, release: str, limit_s: float) -> None:
    argv = _filled(member.restart, release)
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            env=os.environ | {"LLMGW_RELEASE": release},
            timeout=limit_s,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        output.fail(f"{member.name}: `{' '.join(argv)}`: {exc}; the roll stops here")
    if done.returncode != 0:
        output.fail(
            f"{member.name}: `{' '.join(argv)}` exited {done.returncode}: {done.stderr.strip()[-1500:]}"
        )


def roll(plan: ControlPlanePlan, release: str) -> list[str]:
    """Restart every member on `release` in order, each waited for; what was done, in words."""
    base = {c.name: c.url.rstrip("/") for c in plan.controllers}
    leading = {name: probe_status(url + "/healthz/leader") == 200 for name, url in base.items()}
    done: list[str] = []
    for role, member in order(plan.controllers, leading, plan.routers):
        url = member.url.rstrip("/")
        output.console(stderr=True).print(f"{member.name} ({role}): restarting on {release}", highlight=False)
        restart(member, release, plan.restart_timeout_s)
        if role == "router":
            wait_status(url + "/ready", 200, plan.ready_timeout_s, f"router {member.name}")
            time.sleep(plan.lb_settle_s)  # the balancer's checks see it up before the next one drains
        else:
            wait_status(url + "/healthz", 200, plan.ready_timeout_s, f"controller {member.name}")
        if role == "leader" and len(base) > 1:
            others = [u for n, u in base.items() if n != member.name]
            _wait_any_leader([*others, url], plan.ready_timeout_s)
        done.append(f"{member.name} ({role})")
    return done


def _wait_any_leader(urls: list[str], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while not any(probe_status(u + "/healthz/leader") == 200 for u in urls):
        if time.monotonic() > deadline:
            output.fail(f"no controller leads {limit_s:.0f}s after the leader restarted; the roll stops here")
        time.sleep(0.2)


def run(plan_path: Path, to: str | None, *, rollback: bool, allow_irreversible: bool) -> None:
    """Move the control plane to `to` (or back to the previous release): the store's check, then the roll."""
    plan = load_plan(plan_path)
    state = read_state(plan, plan_path)
    running = state["current"] or plan.release
    if rollback:
        if state["previous"] is None:
            output.fail(
                "--rollback: no upgrade recorded in the state file, so there is no release to go back to"
            )
        target = state["previous"]
    elif to is None:
        output.fail("--control-plane needs --to RELEASE (the release to move to) or --rollback")
    else:
        target = to
    if target == running:
        output.fail(f"the control plane already runs {running}")
    have = store_version(plan.store)
    with ThreadPoolExecutor(max_workers=2) as pool:  # two releases asked at once: each starts a process
        asked = pool.map(lambda release: release_migrations(plan, release), (running, target))
        running_has, target_has = list(asked)
    step = store_step(have, running_has, target_has, allow_irreversible=allow_irreversible)
    if step.refusal is not None:
        output.fail(step.refusal)
    err = output.console(stderr=True)
    if step.down_to is not None:
        argv = [*_filled(plan.llmgw, running), "store", "migrate", "--down-to", str(step.down_to)]
        done = subprocess.run([*argv, "--store", plan.store], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            output.fail(f"undoing migrations with {running}: {done.stderr.strip()[-1500:]}")
        err.print(f"store: {done.stdout.strip()}", highlight=False, markup=False)
    elif step.crossing:
        listed = ", ".join(f"{m.version:04d} {m.name}" for m in step.crossing)
        err.print(f"store: at version {have}; {target} migrates it across {listed}", highlight=False)
    moved = roll(plan, target)
    _write_state(plan, plan_path, target, running)
    print(f"control plane on {target} (was {running}): {', '.join(moved)}")
