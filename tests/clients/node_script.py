"""Runs one of the npm client scripts in tests/clients/node (installed by `make node-clients`) against the gateway
and returns the JSON line it printed: what its tool loop did."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

from clients.gateway import NODE_DIR, Gateway

NODE_S = 120.0


def run_node(gateway: Gateway, script: str, *args: str) -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, (
        "node is not on PATH: `make system-deps` installs Node.js (scripts/install-system-deps.sh)"
    )
    assert (NODE_DIR / "node_modules").is_dir(), (
        f"{NODE_DIR}/node_modules is missing: run `make node-clients`"
    )
    env = {
        **os.environ,
        "LLMGW_BASE_URL": gateway.base_url,
        "LLMGW_API_KEY": gateway.api_key,
        "LLMGW_MODEL": gateway.model,
    }
    done = subprocess.run(
        [node, str(NODE_DIR / script), *args],
        cwd=NODE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=NODE_S,
        check=False,
    )
    assert done.returncode == 0, f"node {script} {' '.join(args)} exited {done.returncode}:\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert lines, f"node {script} printed nothing; stderr:\n{done.stderr}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result
