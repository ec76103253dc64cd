"""The last check of `llmgw store restore`: the controller starts on what was restored.

The controller of `--controller-config` is started as its service would start it (`llmgw controller --config`),
on loopback ports of its own so it cannot meet the deployment's clients; it must answer /healthz, then its admin
API must take the restored admin token (the token, the store and the settings agree). Then it is stopped.
Every other setting is the file's: it reads the restored secrets directory, CA and cluster secret.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llmgw.cli import output
from llmgw.cli.admin_client import probe_status

START_LIMIT_S = 90.0


def _loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _settings(config: Path) -> dict[str, Any]:
    from llmgw.controller.parts.settings import load_settings_file

    return load_settings_file(config)


def _tls(values: dict[str, Any]) -> ssl.SSLContext | None:
    """How to reach a controller that serves TLS: its cluster CA's certificate verifies it; with a certificate
    of the operator's own, only that it answers is checked (the CA that signed it is not in the settings)."""
    if values.get("ca_dir"):
        return ssl.create_default_context(cafile=str(Path(values["ca_dir"]) / "ca.crt"))
    if values.get("tls_cert"):
        unverified = ssl.create_default_context()
        unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
        return unverified
    return None


def _admin_token(values: dict[str, Any]) -> str:
    path = Path(
        values.get("admin_token_file") or Path(values.get("state_dir") or ".llmgw/controller") / "admin-token"
    )
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        output.fail(f"check: the admin token {path} is not there after the restore: {exc.strerror}")


def start_controller(config: Path) -> str:
    """Start, probe and stop the controller; what it showed, or exit 1 with its log's end."""
    values = _settings(config)
    token, tls = _admin_token(values), _tls(values)
    port = _loopback_port()
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-c",
        "from llmgw.cli.main import main; main()",
        "controller",
        "--config",
        str(config),
        "--listen",
        f"127.0.0.1:{port}",
        "--metrics-listen",
        f"127.0.0.1:{_loopback_port()}",
    ]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        try:
            healthy = _wait(proc, url + "/healthz", tls)
            answered = probe_status(url + "/api/v1/status", token, tls) if healthy else None
        finally:
            _stop(proc)
        if healthy and answered == 200:
            return f"the controller started on the restored store and took the restored admin token ({url})"
        log.seek(0)
        tail = log.read().decode(errors="replace")[-3000:]
    why = "did not answer /healthz" if not healthy else f"refused the restored admin token ({answered})"
    output.fail(f"check: the controller {why}; its log ends:\n{tail}")


def _wait(proc: subprocess.Popen[bytes], url: str, tls: ssl.SSLContext | None) -> bool:
    deadline = time.monotonic() + START_LIMIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if probe_status(url, None, tls) == 200:
            return True
        time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
