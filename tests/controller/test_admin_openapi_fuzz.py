"""schemathesis against a live controller's admin API, from the document it serves (issue 49): a fixed seed, a
bounded number of examples per operation, every answer checked against the document (no 500; status, content
type, headers and body as documented; a request the schema refuses is refused, one it allows is not; no
operation answers without its token). The operations that act on machines are left out (`EXCLUDED`).

The counts are printed (`pytest -s` shows them) and the run's JSON report is kept under the test's tmp_path.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from support import free_port, wait_for

from controller.helpers import Admin, Agents, Repo, cluster_yaml, model_yaml, settings_for, start
from llmgw.controller.api.routes import OPENAPI_PATH, ROUTES

pytestmark = pytest.mark.integration

NODE = "n1"  # admin_openapi_schemathesis.toml names it
SEED = 49
EXAMPLES_PER_OPERATION = 25
CONFIG = Path(__file__).with_name("admin_openapi_schemathesis.toml")
# Operations that change what runs on machines: a fuzzer must never reach them, even pointed at a controller
# with nodes (this one has none).
EXCLUDED = {
    "POST /api/v1/upgrade": "installs a new agent on every bootstrapped node over SSH",
    "POST /api/v1/weights/collect": "deletes weights from the nodes' disks (dry_run false)",
    "POST /api/v1/restart": "replaces a model's running replicas",
    "POST /api/v1/nodes/{node}/drain": "moves a node's replicas to other nodes",
}


async def _ready(admin: Admin) -> bool:
    return any(r["state"] == "ready" for r in await admin.replicas("m"))


def _command(url: str, token: str, report: Path) -> list[str]:
    ids = {f"{r.endpoint.method} {r.endpoint.path}": r.endpoint.operation_id for r in ROUTES}
    assert set(EXCLUDED) <= set(ids), (
        f"EXCLUDED names operations the route table has not: {set(EXCLUDED) - set(ids)}"
    )
    excluded = [arg for op in EXCLUDED for arg in ("--exclude-operation-id", ids[op])]
    return [
        str(Path(sys.executable).with_name("schemathesis")),
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        url + OPENAPI_PATH,
        "--url",
        url,
        "--header",
        f"Authorization: Bearer {token}",
        "--seed",
        str(SEED),
        "--max-examples",
        str(EXAMPLES_PER_OPERATION),
        "--generation-database",
        "none",
        "--phases",
        "examples,coverage,fuzzing",
        "--workers",
        "1",
        "--request-timeout",
        "20",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        *excluded,
    ]


@pytest.mark.timeout(180)
async def test_schemathesis_finds_nothing_in_the_admin_api(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/m.yaml": model_yaml("m", min_=1)})
    port = free_port()
    running, admin = await start(settings_for(tmp_path, repo.path, listen=f"127.0.0.1:{port}"))
    # One real node (an agent process) with a ready replica of m, so the node and log operations reach their
    # handlers' logic rather than their 404 (the config names the node for half of the {node} parameters).
    agents = Agents(tmp_path, tmp_path / "token")
    report = tmp_path / "schemathesis.json"
    proc: asyncio.subprocess.Process | None = None
    try:
        agents.start(NODE, f"127.0.0.1:{port}")
        await wait_for(lambda: _ready(admin), 60, "a ready replica of m")
        proc = await asyncio.create_subprocess_exec(
            *_command(running.url, running.admin_token, report),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=150)
    finally:
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        await running.stop()
        agents.cleanup()
    text = out.decode(errors="replace")
    summary = text[text.find("=== SUMMARY") :] if "=== SUMMARY" in text else text[-3000:]
    print(summary)
    assert proc.returncode == 0, text[-20000:]
    done = json.loads(report.read_text(encoding="utf-8"))
    operations, cases = done["operations"], done["test_cases"]
    print(
        f"schemathesis: {operations['tested']} operations tested, {cases['generated']} examples, "
        f"{cases['unique_failures']} findings, {done['running_time']:.0f} s"
    )
    # Every operation but the excluded ones, and the document's own (schemathesis leaves out the URL it read).
    assert operations["tested"] == len(ROUTES) - len(EXCLUDED) - 1, operations
    assert (operations["errored"], cases["errored"], cases["unique_failures"]) == (0, 0, 0), done["errors"]
