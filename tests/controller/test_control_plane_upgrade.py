"""`llmgw upgrade --control-plane` between two releases built from this tree, with clients sending throughout.

The two releases are copies of this tree's packages (llmgw, llmgw_router, llmgw_agent) in their own directories,
run with PYTHONPATH naming one of them: release B is release A with one harmless migration more (a table no code
reads, with its .down.sql). Two controllers (HA, one PostgreSQL store) and two routers run from release A, as
a service manager would run them (tests/controller/service_shim.py restarts one on a release); the routers sit
behind HAProxy, which checks each one's /ready. Sim agents serve the model.

While two clients send requests through HAProxy, it rolls standby, leader, router, router onto B; then --rollback
goes back to A, the migration undone first (a migration that cannot be undone is refused before anything
restarts: test_control_plane_upgrade_plan.py). No request fails at any point, and the store holds one usage row per request answered.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import psycopg
import pytest
import yaml
from faults.procs import http_status
from support import free_port, wait_until
from typer.testing import CliRunner

import llmgw
from controller.helpers import Agents, Repo, cluster_yaml, model_yaml
from llmgw.adapters import keys as keymod
from llmgw.cli.main import app
from llmgw.store import Store
from llmgw.store.migrate import load_migrations

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

TOKEN = "control-plane-token"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SHIM = Path(__file__).with_name("service_shim.py")
SOURCE = Path(llmgw.__file__).resolve().parents[1]
PACKAGES = ("llmgw", "router/llmgw_router", "agent/llmgw_agent")
# `-P`: without it a `python -c` process puts its working directory first on sys.path, and run from this tree
# it would import this tree's packages instead of its release's.
RELEASE_PYTHON = (sys.executable, "-P")
DRAIN_DELAY_S = 1.0  # > HAProxy's inter (0.2s) x fall (1): it has stopped sending before the router closes


def build_release(target: Path, extra_migration: int | None) -> Path:
    """A copy of this tree's packages; with `extra_migration`, one migration more (and the way back)."""
    for package in PACKAGES:
        shutil.copytree(SOURCE / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    if extra_migration is not None:
        migrations = target / "llmgw" / "store" / "migrations"
        name = f"{extra_migration:04d}_upgrade_probe"
        (migrations / f"{name}.sql").write_text("CREATE TABLE upgrade_probe (id BIGINT PRIMARY KEY);\n")
        (migrations / f"{name}.down.sql").write_text("DROP TABLE upgrade_probe;\n")
    return target


@dataclass
class Service:
    name: str
    url: str
    spec: Path
    pidfile: Path

    def restart_argv(self) -> list[str]:
        return [sys.executable, str(SHIM), str(self.spec), "{release}"]


@dataclass
class Lab:
    tmp: Path
    dsn: str
    services: list[Service] = field(default_factory=list)
    haproxy: subprocess.Popen[bytes] | None = None
    agents: Agents | None = None

    def service(self, name: str, url: str, argv: list[str]) -> Service:
        spec = self.tmp / f"{name}.json"
        pidfile = self.tmp / f"{name}.pid"
        spec.write_text(
            json.dumps({"argv": argv, "pidfile": str(pidfile), "log": str(self.tmp / f"{name}.log")})
        )
        made = Service(name, url, spec, pidfile)
        self.services.append(made)
        return made

    def start(self, service: Service, release: Path) -> None:
        subprocess.run([*service.restart_argv()[:-1], str(release)], check=True, timeout=90)

    def close(self) -> None:
        for s in self.services:
            if s.pidfile.exists():
                subprocess.run(["kill", "-KILL", "--", f"-{s.pidfile.read_text().strip()}"], check=False)
        if self.haproxy is not None:
            self.haproxy.kill()
            self.haproxy.wait(10)
        if self.agents is not None:
            self.agents.cleanup()

    def log_tail(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@pytest.fixture
def lab(tmp_path: Path, pg_dsn: str) -> Iterator[Lab]:
    made = Lab(tmp_path, pg_dsn)
    try:
        yield made
    finally:
        made.close()


def haproxy_config(port: int, routers: list[Service]) -> str:
    servers = "\n".join(f"  server {r.name} {r.url.removeprefix('http://')} check" for r in routers)
    # No retries: a request HAProxy sent to a router that had stopped listening would reach the client as an
    # error, so the drain (not the balancer) is what keeps them all answered.
    return f"""\
defaults
  mode http
  timeout connect 2s
  timeout client 30s
  timeout server 30s
  retries 0
  option http-server-close
listen api
  bind 127.0.0.1:{port}
  option httpchk GET /ready
  http-check expect status 200
  default-server inter 200ms fall 1 rise 1
{servers}
"""


@dataclass
class Clients:
    """Threads sending completions through the balancer until stopped; every answer and failure counted."""

    base_url: str
    key: str
    answered: int = 0
    failures: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def send_one(self, client: openai.OpenAI) -> bool:
        try:
            r = client.completions.create(model="sim-a", prompt="upgrade", max_tokens=2)
        except openai.APIError as exc:
            with self.lock:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            return False
        with self.lock:
            self.answered += 1
        return bool(r.choices)

    def run(self) -> None:
        client = openai.OpenAI(base_url=self.base_url, api_key=self.key, max_retries=0, timeout=30)
        while not self.stop.wait(0.02):  # a steady stream, leaving CPU to the processes being upgraded
            self.send_one(client)

    def start(self, count: int) -> None:
        for i in range(count):
            t = threading.Thread(target=self.run, name=f"client-{i}", daemon=True)
            t.start()
            self.threads.append(t)

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)


def controller_service(lab: Lab, name: str, repo: Path, secrets: Path) -> Service:
    port = free_port()
    settings = {
        "repo": str(repo),
        "poll_s": 0.3,
        "store": lab.dsn,
        "listen": f"127.0.0.1:{port}",
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "admin_token_file": str(lab.tmp / "token"),
        "state_dir": str(lab.tmp / f"state-{name}"),
        "secrets_dir": str(secrets),
        "drain_s": 0.3,
        "ha": True,
        "lease_ttl_s": 3.0,
        "lease_renew_s": 0.5,
    }
    config = lab.tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(settings))
    argv = [
        *RELEASE_PYTHON,
        "-c",
        "from llmgw.cli.main import main; main()",
        "controller",
        "--config",
        str(config),
    ]
    return lab.service(name, f"http://127.0.0.1:{port}", argv)


def router_service(lab: Lab, name: str, controllers: list[Service]) -> Service:
    port = free_port()
    follow = [arg for c in controllers for arg in ("--controller", c.url)]
    flags = {
        "--token-file": str(lab.tmp / "token"),
        "--store": lab.dsn,
        "--router-id": name,
        "--listen": f"127.0.0.1:{port}",
        "--metrics-listen": f"127.0.0.1:{free_port()}",
        "--state-dir": str(lab.tmp / f"state-{name}"),
        "--drain-delay": str(DRAIN_DELAY_S),
        "--usage-flush-interval": "0.2",
    }
    given = [word for flag, value in flags.items() for word in (flag, value)]
    argv = [*RELEASE_PYTHON, "-c", "from llmgw_router.main import main; main()", *follow, *given]
    return lab.service(name, f"http://127.0.0.1:{port}", argv)


def running_release(service: Service) -> str:
    """The release the service's process runs: the first PYTHONPATH entry in its environment."""
    pid = int(service.pidfile.read_text())
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    [paths] = [e.decode() for e in environ if e.startswith(b"PYTHONPATH=")]
    return paths.removeprefix("PYTHONPATH=").split(":")[0]


def store_state(dsn: str) -> tuple[int, int]:
    """The store's schema version and its usage rows of answered requests (a probe refused while the model was
    not served yet is a row too, of another status)."""
    with psycopg.connect(dsn) as conn:
        version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        usage = conn.execute("SELECT COUNT(*) FROM usage WHERE status = 200").fetchone()
    assert version is not None and usage is not None
    return int(version[0]), int(usage[0])


def upgrade(plan: Path, *args: str) -> tuple[int, str]:
    """The command, run here (its restart commands and the releases' own llmgw are processes of their own)."""
    result = CliRunner().invoke(app, ["upgrade", "--control-plane", "--plan", str(plan), *args])
    return result.exit_code, result.output


async def _make_key(dsn: str) -> str:
    store = await Store.open(dsn)
    try:
        return (await keymod.create_key(store, "p1", 0.0)).plaintext
    finally:
        await store.close()


def write_plan(lab: Lab, release: Path, controllers: list[Service], routers: list[Service]) -> Path:
    def member(s: Service) -> dict[str, object]:
        return {"name": s.name, "url": s.url, "restart": s.restart_argv()}

    plan = {
        "store": lab.dsn,
        "llmgw": [
            "env",
            "PYTHONPATH={release}:{release}/router:{release}/agent",
            *RELEASE_PYTHON,
            "-c",
            "from llmgw.cli.main import main; main()",
        ],
        "release": str(release),
        "controllers": [member(c) for c in controllers],
        "routers": [member(r) for r in routers],
        "ready_timeout_s": 60,
        "lb_settle_s": 0.5,  # > HAProxy's inter x rise: it sends to the router again before the next drains
    }
    path = lab.tmp / "control-plane.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def bring_up(lab: Lab, release: Path) -> tuple[list[Service], list[Service], int]:
    """Two HA controllers (c1 leads), sim agents serving sim-a, two routers on release A behind HAProxy."""
    token = lab.tmp / "token"
    token.write_text(TOKEN + "\n")
    secrets = lab.tmp / "secrets"
    secrets.mkdir()
    (secrets / "cluster-secret").write_text("upgrade-cluster-secret\n")
    repo = Repo(lab.tmp / "origin", use_git=True)
    # Lost only after a minute: an agent moving to the new leader is not a node gone (the engines keep serving).
    cluster = cluster_yaml(unreachable="5s", lost="60s") + "  secret: {file: cluster-secret}\n"
    repo.write({"cluster.yaml": cluster}, "cluster")
    repo.write({"models/a.yaml": model_yaml("sim-a", min_=1)}, "add sim-a")
    controllers = [controller_service(lab, name, repo.path, secrets) for name in ("c1", "c2")]
    first, second = controllers
    lab.start(first, release)
    wait_until(lambda: http_status(first.url + "/healthz/leader") == 200, 60, "c1 to lead")
    routers = [router_service(lab, name, controllers) for name in ("r1", "r2")]
    for s in (second, *routers):  # started together: each is waited for below
        lab.start(s, release)
    lab.agents = Agents(lab.tmp, token)
    lab.agents.start("n1", [c.url for c in controllers])
    wait_until(lambda: http_status(second.url + "/healthz/leader") == 503, 60, "c2 to stand by")
    for r in routers:
        wait_until(lambda r=r: http_status(r.url + "/ready") == 200, 90, f"{r.name} /ready")
    port = free_port()
    config = lab.tmp / "haproxy.cfg"
    config.write_text(haproxy_config(port, routers))
    log = (lab.tmp / "haproxy.log").open("ab")
    lab.haproxy = subprocess.Popen(
        [HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=log, start_new_session=True
    )
    return controllers, routers, port


@pytest.mark.skipif(
    not Path(HAPROXY).exists(), reason="haproxy is not installed (scripts/install-system-deps.sh)"
)
def test_rolling_upgrade_and_rollback_lose_no_request(lab: Lab) -> None:
    top = max(m.version for m in load_migrations())
    release_a = build_release(lab.tmp / "releases" / "a", None)
    release_b = build_release(lab.tmp / "releases" / "b", top + 1)
    controllers, routers, port = bring_up(lab, release_a)
    clients = Clients(f"http://127.0.0.1:{port}/v1", asyncio.run(_make_key(lab.dsn)))
    probe = openai.OpenAI(base_url=clients.base_url, api_key=clients.key, max_retries=0, timeout=30)
    wait_until(lambda: clients.send_one(probe), 60, "sim-a through HAProxy")
    clients.failures.clear()  # before the model was served: not the upgrade's
    plan = write_plan(lab, release_a, controllers, routers)
    services = [*controllers, *routers]
    clients.start(2)
    try:
        code, said = upgrade(plan, "--to", str(release_b))
        assert code == 0, said + "".join(lab.log_tail(s.name) for s in services)
        rolled = [line.split(":")[0] for line in said.splitlines() if "restarting on" in line]
        assert rolled == ["c2 (standby)", "c1 (leader)", "r1 (router)", "r2 (router)"], said
        assert {running_release(s) for s in services} == {str(release_b)}
        assert store_state(lab.dsn)[0] == top + 1
        wait_until(lambda: http_status(controllers[1].url + "/healthz/leader") == 200, 30, "c2 leads")
        answered = clients.answered
        wait_until(lambda: clients.answered >= answered + 10, 30, "requests served on release B")

        code, said = upgrade(plan, "--rollback")
        assert code == 0, said + "".join(lab.log_tail(s.name) for s in services)
        assert f"undid migrations [{top + 1}]" in said
        rolled = [line.split(":")[0] for line in said.splitlines() if "restarting on" in line]
        assert rolled == ["c1 (standby)", "c2 (leader)", "r1 (router)", "r2 (router)"], said
        assert {running_release(s) for s in services} == {str(release_a)}
        assert store_state(lab.dsn)[0] == top
        answered = clients.answered
        wait_until(lambda: clients.answered >= answered + 10, 30, "requests served on release A again")
    finally:
        clients.finish()
    assert clients.failures == [], clients.failures[:5]
    # Every request answered is in the store, including those the stopped routers flushed on the way out.
    total = clients.answered  # the probe that first got through too
    wait_until(lambda: store_state(lab.dsn)[1] >= total, 30, f"{total} usage rows")
    assert store_state(lab.dsn)[1] == total, "one usage row per request answered, no more"
    assert "already runs" in upgrade(plan, "--to", str(release_a))[1]
