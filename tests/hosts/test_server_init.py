"""`llmgw server init` on a Debian machine with nothing of llmgw's and no PostgreSQL: a lab host whose root file
system is a debootstrapped bookworm (tests/hosts/debian_tree.py), init acting on it with `--root`.

The machine is a node too (`--node`): its agent registers and runs the starter repo's sim models. Real: apt-get
installs PostgreSQL and git in the tree (from the .debs the cached tree holds: the host has no
route out), the account, the CA, the certificate for every address of the host, the role and database with a
generated password, the migrations, the starter repo, the settings and the units, which `systemd-analyze verify`
accepts. systemd is not PID 1 here, so init starts each unit's own command as the llmgw account (its process
mode) and waits for /health over TLS (the agent: its node Ready). Then a key is made through the controller, a
chat completion is served by the router over TLS verified against init's CA at the host's address, the console
(the controller's, over TLS) gives a Secure session cookie, and a second init changes nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from http.cookies import SimpleCookie
from pathlib import Path

import pytest
from support import wait_until

from hosts.debian_tree import PROJECT, cached_tree_ready, debian_tree, interpreter_paths, mount_into, overlay
from hosts.lab import HostLab
from hosts.machine import Host

pytestmark = [pytest.mark.hosts]

BIN = Path(sys.executable).parent
SOURCE_PATH = os.pathsep.join(str(PROJECT / p) for p in (".", "router", "agent"))


def _init(host: Host, tree: Path, *extra: str) -> dict[str, tuple[str, str]]:
    argv = [str(BIN / "llmgw"), "server", "init", "--root", str(tree), "--bin-dir", str(BIN)]
    argv += ["--env", f"PYTHONPATH={SOURCE_PATH}", "--starter", str(PROJECT / "examples" / "cluster-repo")]
    argv += ["--name", "edge1", "--node", "--health-timeout", "120", *extra]
    # The steps' lines are the answer even when a step failed: the exit status comes last, after them.
    out = host.run(["sh", "-c", shlex.join(argv) + ' 2>&1; echo "exit status $?"'], timeout=600)
    assert out.rstrip().endswith("exit status 0"), out
    steps = {}
    for line in out.splitlines():
        name, _, rest = line.partition(" ")
        status, _, detail = rest.strip().partition(" ")
        if status in ("changed", "unchanged", "skipped", "failed"):
            steps[name] = (status, detail.strip())
    assert steps and all(s != "failed" for s, _ in steps.values()), out
    return steps


def _verify_unit(path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "systemd-analyze not installed (scripts/install-system-deps.sh)"
    proc = subprocess.run([analyze, "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr


def _exec_start(unit: Path) -> list[str]:
    line = next(ln for ln in unit.read_text().splitlines() if ln.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def _running_as(host: Host, tree: Path, service: str) -> tuple[list[str], str]:
    pid = (tree / "run" / "llmgw" / f"{service}.pid").read_text().strip()
    cmdline = host.run(["cat", f"/proc/{pid}/cmdline"]).split("\0")[:-1]
    uid = host.run(["stat", "-c", "%u", f"/proc/{pid}"]).strip()
    return cmdline, uid


def _create_key(host: Host, tree: Path) -> str:
    argv = ["env", f"SSL_CERT_FILE={tree}/etc/llmgw/tls/ca.crt", str(BIN / "llmgw"), "keys", "create"]
    argv += ["--project", "playground", "--controller", "https://127.0.0.1:7070"]
    argv += ["--token-file", f"{tree}/etc/llmgw/secrets/admin-token", "--json"]

    refusals: list[str] = []

    def made() -> str | None:
        try:
            return str(json.loads(host.run(argv))["key"])
        except RuntimeError as exc:  # the controller has not read the starter repo's projects yet
            refusals.append(str(exc)[-500:])
            return None

    try:
        return str(wait_until(made, 60, "a key from the controller"))
    except AssertionError:
        raise AssertionError(f"no key from the controller; last refusal: {refusals[-1:]}") from None


def _console_session_cookie(address: str, ca: ssl.SSLContext, admin_token: str) -> str:
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


def test_server_init_installs_a_serving_control_plane(lab: HostLab, tmp_path: Path) -> None:
    if shutil.which("debootstrap") is None and not cached_tree_ready():
        reason = "debootstrap not installed (scripts/install-system-deps.sh) and no cached Debian tree"
        if os.environ.get("CI") or os.environ.get("LLMGW_REQUIRE_TOOLS"):
            pytest.fail(reason)
        pytest.skip(reason)
    host = lab.add_host("server")
    tree, changed = overlay(host, tmp_path)  # init acts on `tree`; what it wrote is in `changed`
    mount_into(host, tree)
    assert not (debian_tree() / "usr/lib/postgresql").exists(), "the cached tree must come without PostgreSQL"

    dry = _init(host, tree, "--dry-run")
    assert dry["packages"] == ("skipped", "would install git postgresql with apt-get")
    assert dry["controller"][0] == "skipped"
    mounted = {p.relative_to("/").parts[0] for p in interpreter_paths()}
    assert {p.name for p in changed.iterdir()} <= mounted, "the dry run wrote something"

    first = _init(host, tree)
    for step in ("packages", "account", "ca", "certificates", "store", "migrations", "repo", "config"):
        assert first[step][0] == "changed", (step, first[step])
    assert host.address in first["certificates"][1]  # the certificate names the host's own address
    assert first["controller"][0] == first["router"][0] == "changed"
    assert (changed / "usr/lib/postgresql").is_dir()

    passwd = (changed / "etc" / "passwd").read_text()
    uid = next(ln.split(":")[2] for ln in passwd.splitlines() if ln.startswith("llmgw:"))
    for service in ("controller", "router", "agent"):
        unit = changed / "etc" / "systemd" / "system" / f"llmgw-{service}.service"
        _verify_unit(unit)
        cmdline, runs_as = _running_as(host, changed, service)
        want = _exec_start(unit)
        assert cmdline[-len(want) :] == want, (service, cmdline)  # the unit's own command
        assert runs_as == uid, f"the {service} runs as uid {runs_as}, not llmgw's {uid}"

    key = _create_key(host, tree)
    ca = ssl.create_default_context(cafile=str(changed / "etc" / "llmgw" / "tls" / "ca.crt"))
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

    def served() -> dict[str, object] | None:
        request = urllib.request.Request(
            f"https://{host.address}:8443/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=ca) as resp:
                answer: dict[str, object] = json.loads(resp.read())
                return answer
        except urllib.error.HTTPError as exc:  # 503 until the node's sim replicas are ready
            assert exc.code == 503, exc.read()
            return None

    answer = wait_until(served, 90, "a chat completion over TLS from the router at the host's address")
    assert answer["object"] == "chat.completion" and answer["choices"], answer

    # The console is the controller's, served over TLS: its session cookie is Secure.
    admin = (changed / "etc" / "llmgw" / "secrets" / "admin-token").read_text().strip()
    cookie = _console_session_cookie(host.address, ca, admin)
    assert "secure" in cookie.lower().split("; "), cookie

    second = _init(host, tree)
    assert {s for s, _ in second.values()} == {"unchanged"}, second
