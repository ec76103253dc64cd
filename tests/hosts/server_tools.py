"""What the server installer's end-to-end tests do on lab hosts: a host whose root is the cached Debian tree,
`llmgw server init` and `llmgw server add` run there with their steps' lines read back, and the checks made of
what they installed (units, the processes they run, a key, the console's cookie)."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from support import wait_until

from hosts.debian_tree import PROJECT, cached_tree_ready, mount_into, overlay
from hosts.lab import HostLab
from hosts.machine import Host

BIN = Path(sys.executable).parent
SOURCE_PATH = os.pathsep.join(str(PROJECT / p) for p in (".", "router", "agent"))


@dataclass
class DebianHost:
    host: Host
    tree: Path  # the host's root, as the host sees it (init and add act on it)
    changed: Path  # what was written to it, readable from the test


def require_debian_tree() -> None:
    if shutil.which("debootstrap") is None and not cached_tree_ready():
        reason = "debootstrap not installed (scripts/install-system-deps.sh) and no cached Debian tree"
        if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
            pytest.fail(reason)
        pytest.skip(reason)


def debian_host(lab: HostLab, name: str) -> DebianHost:
    """A lab host with its own root: the cached tree through an overlay, the interpreter mounted in."""
    host = lab.add_host(name)
    scratch = lab.tmp / f"{name}-root"
    scratch.mkdir()
    tree, changed = overlay(host, scratch)
    mount_into(host, tree)
    return DebianHost(host, tree, changed)


def llmgw_steps(host: Host, argv: list[str]) -> dict[str, tuple[str, str]]:
    """`llmgw ARGV` run on the host: each step's (status, words), read from its lines; it must succeed."""
    # The steps' lines are the answer even when a step failed: the exit status comes last, after them.
    command = shlex.join([str(BIN / "llmgw"), *argv])
    out = host.run(["sh", "-c", command + ' 2>&1; echo "exit status $?"'], timeout=600)
    assert out.rstrip().endswith("exit status 0"), out
    steps = {}
    for line in out.splitlines():
        name, _, rest = line.partition(" ")
        status, _, detail = rest.strip().partition(" ")
        if status in ("changed", "unchanged", "skipped", "failed"):
            steps[name] = (status, detail.strip())
    assert steps and all(s != "failed" for s, _ in steps.values()), out
    return steps


def service_args() -> list[str]:
    """What every service the installer starts is given: this checkout's code, the test's interpreter."""
    return ["--bin-dir", str(BIN), "--env", f"PYTHONPATH={SOURCE_PATH}", "--health-timeout", "120"]


def init(server: DebianHost, *extra: str) -> dict[str, tuple[str, str]]:
    argv = ["server", "init", "--root", str(server.tree), *service_args()]
    argv += ["--starter", str(PROJECT / "examples" / "cluster-repo"), "--name", "edge1", "--node", *extra]
    return llmgw_steps(server.host, argv)


def verify_unit(path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze not installed (scripts/install-system-deps.sh)"
    proc = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def exec_start(unit: Path) -> list[str]:
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def pid_of(server: DebianHost, service: str) -> str:
    return (server.changed / "run" / "llmgw" / f"{service}.pid").read_text().strip()


def running_as(server: DebianHost, service: str) -> tuple[list[str], str]:
    pid = pid_of(server, service)
    cmdline = server.host.run(["cat", f"/proc/{pid}/cmdline"]).split("\0")[:-1]
    uid = server.host.run(["stat", "-c", "%u", f"/proc/{pid}"]).strip()
    return cmdline, uid


def create_key(server: DebianHost) -> str:
    tree = server.tree
    argv = ["env", f"SSL_CERT_FILE={tree}/etc/llmgw/tls/ca.crt", str(BIN / "llmgw"), "keys", "create"]
    argv += ["--project", "playground", "--controller", "https://127.0.0.1:7070"]
    argv += ["--token-file", f"{tree}/etc/llmgw/secrets/admin-token", "--json"]

    refusals: list[str] = []

    def made() -> str | None:
        try:
            return str(json.loads(server.host.run(argv))["key"])
        except RuntimeError as exc:  # the controller has not read the starter repo's projects yet
            refusals.append(str(exc)[-500:])
            return None

    try:
        return str(wait_until(made, 60, "a key from the controller"))
    except AssertionError:
        raise AssertionError(f"no key from the controller; last refusal: {refusals[-1:]}") from None


def console_session_cookie(address: str, ca: ssl.SSLContext, admin_token: str) -> str:
    """The web console's session cookie after signing in with the admin token, over the controller's TLS."""
    conn = http.client.HTTPSConnection(address, 7070, context=ca, timeout=10)
    try:
        conn.request("GET", "/ui/login")
        form = conn.getresponse()
        form.read()
        login = SimpleCookie(form.getheader("Set-Cookie", ""))
        name, morsel = next(iter(login.items()))
        body = urllib.parse.urlencode({"csrf": morsel.value, "token": admin_token})
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Cookie": f"{name}={morsel.value}"}
        conn.request("POST", "/ui/login", body, headers)
        signed_in = conn.getresponse()
        signed_in.read()
        assert signed_in.status == 303, signed_in.status
        return next(c for c in signed_in.headers.get_all("Set-Cookie") or [] if not c.startswith(name + "="))
    finally:
        conn.close()
