"""The router terminates TLS itself (`--tls-cert/--tls-key`, ALPN http/1.1), as `llmgw server init` sets it up:
a client verifying against the cluster CA gets its answers, one that does not trust the CA is refused in the
handshake, and plain HTTP on the TLS port gets no answer. Its settings may come from a `--config` file (flags win).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from llmgw_router.main import parse_args
from support import free_port, wait_until

from llmgw.adapters.keys import hash_key
from llmgw.adapters.ssh.ca import ClusterCA

KEY = "sk-llmgw-" + "t" * 43


def _context(ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # offers h2 first: the router must pick http/1.1
    return ctx


def _get(port: int, ca: Path, path: str, key: str | None = KEY) -> tuple[int, bytes, str | None]:
    conn = http.client.HTTPSConnection("localhost", port, context=_context(ca), timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
        resp = conn.getresponse()
        assert conn.sock is not None
        alpn = conn.sock.selected_alpn_protocol()
        return resp.status, resp.read(), alpn
    finally:
        conn.close()


@pytest.fixture
def tls_router(tmp_path: Path) -> Iterator[tuple[int, Path, subprocess.Popen[bytes]]]:
    ca = ClusterCA.open(tmp_path / "ca")
    issued = ca.controller_cert(["127.0.0.1"])  # the control plane's certificate: localhost is always a name
    (tmp_path / "snapshot.json").write_text(
        json.dumps({"revision": "tls-1", "models": {"sim-chat": {"context_length": 4096}}, "endpoints": []})
    )
    (tmp_path / "keys").write_text(f"{hash_key(KEY)} p1 key-1\n")
    port = free_port()
    config = {
        "snapshot": str(tmp_path / "snapshot.json"),
        "keys_file": str(tmp_path / "keys"),
        "listen": f"127.0.0.1:{port}",
        "metrics_listen": f"127.0.0.1:{free_port()}",
        "state_dir": str(tmp_path / "state"),
        "tls_cert": str(issued.cert_path),
        "tls_key": str(issued.key_path),
    }
    (tmp_path / "router.yaml").write_text(json.dumps(config))  # JSON is YAML
    argv = [sys.executable, "-c", "from llmgw_router.main import main; main()"]
    log = (tmp_path / "router.log").open("ab")
    proc = subprocess.Popen(
        [*argv, "--config", str(tmp_path / "router.yaml")], stdout=log, stderr=log, start_new_session=True
    )

    def answering() -> bool:
        assert proc.poll() is None, (tmp_path / "router.log").read_text()[-3000:]
        with contextlib.suppress(OSError):
            return _get(port, ca.cert_path, "/health", None)[0] == 200
        return False

    try:
        wait_until(answering, 60, "the router's /health over TLS")
        yield port, ca.cert_path, proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()


def test_router_serves_tls_verified_against_the_cluster_ca(
    tls_router: tuple[int, Path, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port, ca, _ = tls_router
    status, body, alpn = _get(port, ca, "/v1/models")
    assert status == 200, body
    assert json.loads(body)["object"] == "list"  # the key was checked in the store of keys: an answer
    assert alpn == "http/1.1"
    assert _get(port, ca, "/v1/models", key=None)[0] == 401

    # A client that trusts another authority is refused in the handshake.
    stranger = ClusterCA.open(tmp_path / "other-ca").cert_path
    with pytest.raises(ssl.SSLCertVerificationError):
        _get(port, stranger, "/health", None)

    # Plain HTTP on the TLS port: no HTTP answer comes back.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as plain:
        plain.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert not plain.recv(4096).startswith(b"HTTP/1.1 200")


def test_router_config_file_settings_under_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "router.yaml"
    config.write_text("snapshot: snap.json\nlisten: 0.0.0.0:8443\ntls-cert: /etc/llmgw/tls/server.crt\n")
    ns = parse_args(["--config", str(config), "--listen", "127.0.0.1:9"])
    assert (ns.snapshot, ns.listen, ns.tls_cert) == ("snap.json", "127.0.0.1:9", "/etc/llmgw/tls/server.crt")
    assert parse_args(["--config", str(config)]).listen == "0.0.0.0:8443"

    config.write_text("snapshot: snap.json\nlisen: 0.0.0.0:8443\n")
    with pytest.raises(SystemExit):
        parse_args(["--config", str(config)])
    assert "'lisen' is not a router setting" in capsys.readouterr().err

    with pytest.raises(SystemExit):
        parse_args(["--listen", "127.0.0.1:9"])
    assert "--controller ADDR and --snapshot FILE is required" in capsys.readouterr().err
