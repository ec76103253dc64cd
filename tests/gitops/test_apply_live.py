"""`llmgw plan` and `llmgw apply` against a live controller: the real controller in this process (git source,
SQLite in tmp), one real agent process with a fake inventory running sim engines, and the CLI as a subprocess
run from a directory where the controller left its generated admin token, so no flag names the controller or
the token (the Cluster document's address and the default token file are what they find).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from controller.helpers import Admin, Agents, Repo, settings_for, start
from support import free_port, wait_for

from gitops.repo_fixture import sim_model

pytestmark = pytest.mark.integration

CLUSTER = """\
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: gitops}
spec:
  controller:
    address: "127.0.0.1:%(port)d"
    heartbeat_interval: 200ms
    unreachable_after: 3s
    lost_after: 6s
    resync_interval: 1s
"""
NODE = "apiVersion: llmgw/v1\nkind: Node\nmetadata: {name: local}\nspec: {local: true}\n"
LLMGW = str(Path(sys.executable).parent / "llmgw")


class Cli:
    def __init__(self, cwd: Path) -> None:
        self.cwd = cwd
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            LLMGW,
            *args,
            cwd=self.cwd,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 180)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.repo = Repo(tmp / "repo", use_git=True)
        self.state_dir = tmp / ".llmgw" / "controller"  # the default, relative to where the CLI runs
        self.cli = Cli(tmp)
        self.agents = Agents(tmp, self.state_dir / "admin-token")
        self.running: Any = None
        self.admin: Admin | None = None
        self.first = ""

    async def start(self) -> Admin:
        self.first = self.repo.write(
            {
                "cluster.yaml": CLUSTER % {"port": self.port},
                "nodes.yaml": NODE,
                "models/sim-a.yaml": sim_model("sim-a"),
            },
            "first",
        )
        settings = settings_for(
            self.tmp,
            self.repo.path,
            listen=f"127.0.0.1:{self.port}",
            admin_token_file=None,
            state_dir=self.state_dir,
            poll_s=3600.0,  # the source is read once at start: later revisions arrive only by `llmgw apply`
            settle_s=0.0,
        )
        self.running, self.admin = await start(settings)
        self.agents.start("local", f"127.0.0.1:{self.port}")
        await self.wait_healthy(self.first, ["sim-a"])
        return self.admin

    async def status(self) -> dict[str, Any]:
        assert self.admin is not None
        body: dict[str, Any] = await self.admin.get("/api/v1/status")
        return body

    async def wait_healthy(self, revision: str, models: list[str]) -> dict[str, Any]:
        async def healthy() -> dict[str, Any] | None:
            s = await self.status()
            ok = (s["applied"] or {}).get("revision") == revision and s["sync"] == "Synced"
            health = {m["model"]: m["health"] for m in s["models"]}
            return s if ok and all(health.get(m) == "Healthy" for m in models) else None

        found: dict[str, Any] = await wait_for(
            healthy, 60, f"revision {revision[:12]} Synced with {models} Healthy"
        )
        return found


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        await c.start()
        yield c
    finally:
        if c.running is not None:
            await c.running.stop()
        c.agents.cleanup()


async def test_a_new_model_in_a_commit_is_planned_then_applied_to_synced_and_healthy(
    cluster: Cluster,
) -> None:
    cli = cluster.cli
    code, out, err = await cli("plan", "repo", "--detailed-exitcode")
    assert (code, out.strip().splitlines()[-1]) == (0, "No changes. The fleet matches the cluster repo."), err

    second = cluster.repo.write({"models/sim-b.yaml": sim_model("sim-b")}, "add sim-b")
    code, out, err = await cli("plan", "repo", "--detailed-exitcode")
    assert code == 2, err
    assert "+ model sim-b" in out and "+ start sim-b-" in out and "on local" in out
    assert out.strip().splitlines()[-1] == "Plan: 1 to start, 0 to restart, 0 to stop."
    assert (await cluster.status())["applied"]["revision"] == cluster.first  # planning changes nothing

    code, out, err = await cli("apply", "repo", "--wait", "--timeout", "90s")
    assert code == 0, out + err
    assert f"Revision {second[:12]} applied" in out
    assert "Synced and every model is Healthy" in out
    assert "sim-b Healthy 1/1" in out  # the progress lines (no TTY: plain lines)
    status = await cluster.status()
    assert status["applied"]["revision"] == second and status["sync"] == "Synced"
    assert {m["model"]: m["health"] for m in status["models"]} == {"sim-a": "Healthy", "sim-b": "Healthy"}
    assert cluster.admin is not None
    assert [r["state"] for r in await cluster.admin.replicas("sim-b")] == ["ready"]

    # The saved state a CI job without cluster access plans against gives the same answer.
    code, out, err = await cli("plan", "repo", "--save-state", "state.json")
    assert code == 0 and out.strip().endswith("No changes. The fleet matches the cluster repo."), err
    code, out, _ = await cli(
        "plan", "repo", "--state", "state.json", "--detailed-exitcode", "--revision", second
    )
    assert code == 0


async def test_a_plan_file_made_before_another_change_is_refused(cluster: Cluster) -> None:
    cli = cluster.cli
    sha = cluster.repo.write({"models/sim-b.yaml": sim_model("sim-b")}, "add sim-b")
    code, _, err = await cli("plan", "repo", "--out", "ok.json")
    assert code == 0, err
    code, out, err = await cli("apply", "ok.json", "--wait", "--timeout", "90s")
    assert code == 0, out + err  # a fresh plan applies, though heartbeats went on meanwhile
    applied = (await cluster.status())["applied"]["revision"]
    assert applied == sha  # named as the controller's git source names it, so sync compares like with like

    # A pull request adds sim-c and CI plans its checkout. Not a commit on the followed branch: the controller
    # would apply that itself at its next poll (which `llmgw apply` asks for), whenever that lands.
    pull_request = cluster.tmp / "pull-request"
    shutil.copytree(cluster.repo.path, pull_request, ignore=shutil.ignore_patterns(".git"))
    (pull_request / "models" / "sim-c.yaml").write_text(sim_model("sim-c"))
    code, _, err = await cli("plan", "pull-request", "--out", "stale.json")
    assert code == 0, err
    # Someone applies another change before this plan is applied.
    other = cluster.tmp / "other"
    other.mkdir()
    for name in ("cluster.yaml", "nodes.yaml", "models/sim-a.yaml"):
        (other / name).parent.mkdir(parents=True, exist_ok=True)
        (other / name).write_text((cluster.repo.path / name).read_text())
    # A checkout outside the controller's repo: the local controller refuses to read it by path, so `apply`
    # sends its files instead, as to a remote controller.
    code, out, err = await cli("apply", "other")
    assert code == 0, out + err
    status = await cluster.status()
    meanwhile = status["applied"]["revision"]
    assert meanwhile != applied
    # The poll `llmgw apply` asks for shows the branch tip the first apply already named: no news, so it does
    # not undo the apply made since.
    last_poll = (status["polled"] or {}).get("at", 0.0)
    assert cluster.admin is not None
    await cluster.admin.post("/api/v1/webhook", {}, expect=202)

    async def polled_again() -> dict[str, Any] | None:
        s = await cluster.status()
        return s if (s["polled"] or {}).get("at", 0.0) > last_poll else None

    status = await wait_for(polled_again, 30, "a poll of the source after the webhook")
    assert status["polled"]["revision"] == applied
    assert status["applied"]["revision"] == meanwhile

    code, out, err = await cli("apply", "stale.json", "--wait")
    assert code == 1
    assert "stale" in err and "llmgw plan --out FILE" in err
    assert (await cluster.status())["applied"]["revision"] == meanwhile


async def test_an_invalid_repo_is_refused_with_its_errors_and_nothing_changes(cluster: Cluster) -> None:
    cli = cluster.cli
    broken = sim_model("sim-b").replace("context_length", "context_lenght")
    sha = cluster.repo.write({"models/sim-b.yaml": broken}, "a typo")
    code, _, err = await cli("apply", "repo", "--wait", "--revision", sha)
    assert code == 1
    assert "models/sim-b.yaml:5:3" in err and "context_lenght" in err
    assert "Nothing was applied" in err
    status = await cluster.status()
    assert status["applied"]["revision"] == cluster.first and status["refused"] is None

    code, _out, err = await cli("plan", "repo", "--detailed-exitcode")
    assert code == 1 and "context_lenght" in err

    cluster.repo.write({"models/sim-b.yaml": sim_model("sim-b")}, "fixed")
    (cluster.tmp / "wrong").write_text("not-the-token\n")
    # A token given by flag goes only to a controller named explicitly (never to the repo's address).
    url = f"http://127.0.0.1:{cluster.port}"
    code, out, err = await cli("apply", "repo", "--token-file", "wrong", "--controller", url)
    assert code == 1 and "refused the admin token from --token-file wrong" in err
    assert "not-the-token" not in out + err
    assert (await cluster.status())["applied"]["revision"] == cluster.first


async def test_apply_wait_says_why_a_model_cannot_become_healthy(cluster: Cluster) -> None:
    sha = cluster.repo.write({"models/huge.yaml": sim_model("huge", cores=64)}, "a model too big")
    code, out, err = await cluster.cli(
        "apply", "repo", "--wait", "--timeout", "60s", "--degraded-for", "1s", "--revision", sha
    )
    assert code == 1, out + err
    assert "model huge is Degraded (0/1 ready)" in err
    assert "local" in err and "needs 64" in err  # the node's reason, from the controller's explain
    assert (await cluster.status())["applied"]["revision"] == sha  # applied; just not Healthy
