"""`llmgw server init` on a Debian machine with nothing of llmgw's and no PostgreSQL: a lab host whose root file
system is a debootstrapped bookworm (tests/hosts/debian_tree.py), init acting on it with `--root`; then
`llmgw server add` making a standby controller and a router on a second such host over SSH.

The machine is a node too (`--node`): its agent registers and runs the starter repo's sim models. Real: apt-get
installs PostgreSQL in the tree (from the .debs the cached tree holds: the host has no route out), the account,
the CA, the certificate for every address of the host, the role and database with a generated password, the
migrations, the starter repo, the settings and the units, which `systemd-analyze verify` accepts. systemd is
not PID 1 here, so init starts each unit's own command as the llmgw account (its process mode) and waits for
/health over TLS (the agent: its node Ready). Then a key is made through the controller, a chat completion is
served by the router over TLS verified against init's CA at the host's address, the console (the
controller's, over TLS) gives a Secure session cookie, and a second init changes nothing.

The two tests share the installed first host (installing it is most of their time), in this order: the second
stops the first host's controller to see the standby take over.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from support import wait_until

from hosts.debian_tree import debian_tree, interpreter_paths
from hosts.lab import HostLab
from hosts.server_tools import (
    DebianHost,
    console_session_cookie,
    create_key,
    debian_host,
    exec_start,
    init,
    llmgw_steps,
    pid_of,
    require_debian_tree,
    running_as,
    service_args,
    verify_unit,
)

pytestmark = [pytest.mark.hosts, pytest.mark.xdist_group("server-init")]


@dataclass
class Installed:
    lab: HostLab
    server: DebianHost
    dry: dict[str, tuple[str, str]]  # the steps of init's dry run, then of its first run
    first: dict[str, tuple[str, str]]


@pytest.fixture(scope="module")
def installed(module_lab: HostLab) -> Iterator[Installed]:
    require_debian_tree()
    server = debian_host(module_lab, "server")
    assert not (debian_tree() / "usr/lib/postgresql").exists(), "the cached tree must come without PostgreSQL"
    dry = init(server, "--dry-run")
    mounted = {p.relative_to("/").parts[0] for p in interpreter_paths()}
    assert {p.name for p in server.changed.iterdir()} <= mounted, "the dry run wrote something"
    yield Installed(module_lab, server, dry, init(server))


def test_server_init_installs_a_serving_control_plane(installed: Installed) -> None:
    server, changed, dry, first = installed.server, installed.server.changed, installed.dry, installed.first
    assert dry["packages"] == ("skipped", "would install postgresql with apt-get")
    assert dry["controller"][0] == "skipped"
    for step in ("packages", "account", "ca", "certificates", "store", "migrations", "repo", "config"):
        assert first[step][0] == "changed", (step, first[step])
    assert server.host.address in first["certificates"][1]  # the certificate names the host's own address
    assert first["controller"][0] == first["router"][0] == "changed"
    assert (changed / "usr/lib/postgresql").is_dir()

    passwd = (changed / "etc" / "passwd").read_text()
    uid = next(ln.split(":")[2] for ln in passwd.splitlines() if ln.startswith("llmgw:"))
    for service in ("controller", "router", "agent"):
        unit = changed / "etc" / "systemd" / "system" / f"llmgw-{service}.service"
        verify_unit(unit)
        cmdline, runs_as = running_as(server, service)
        want = exec_start(unit)
        assert cmdline[-len(want) :] == want, (service, cmdline)  # the unit's own command
        assert runs_as == uid, f"the {service} runs as uid {runs_as}, not llmgw's {uid}"

    key = create_key(server)
    ca = ssl.create_default_context(cafile=str(changed / "etc" / "llmgw" / "tls" / "ca.crt"))
    body = {"model": "sim-chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

    def served() -> dict[str, object] | None:
        request = urllib.request.Request(
            f"https://{server.host.address}:8443/v1/chat/completions",
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
    cookie = console_session_cookie(server.host.address, ca, admin)
    assert "secure" in cookie.lower().split("; "), cookie

    second = init(server)
    assert {s for s, _ in second.values()} == {"unchanged"}, {
        k: v for k, v in second.items() if v[0] != "unchanged"
    }


def _leads(address: str, ca: ssl.SSLContext) -> bool | None:
    """Whether the controller at `address` holds the lease (/healthz/leader); None when it does not answer."""
    try:
        with urllib.request.urlopen(f"https://{address}:7070/healthz/leader", timeout=5, context=ca):
            return True
    except urllib.error.HTTPError as exc:
        return False if exc.code == 503 else None
    except OSError:
        return None


def test_server_add_makes_a_standby_that_takes_over(installed: Installed) -> None:
    lab, first = installed.lab, installed.server
    second = debian_host(lab, "standby")
    # sshd of the second host logs root in to that host's own root file system; sshd wants every directory up
    # to it root's alone, so the tree is also mounted at /mnt (in that host's mount namespace only).
    second.host.run(["mount", "--rbind", str(second.tree), "/mnt"])
    lab.start_sshd("standby", ("ChrootDirectory /mnt", "Subsystem sftp internal-sftp"))
    known_hosts = lab.tmp / "known_hosts"
    host_key = (second.host.disk / "ssh_host_ed25519.pub").read_text().split()[:2]
    known_hosts.write_text(f"{second.host.address} {' '.join(host_key)}\n")
    # The standby follows the starter repo the first host's controller follows, served by git's daemon there.
    repos = first.tree / "var" / "lib" / "llmgw"
    daemon = ["git", "-c", "safe.directory=*", "daemon", "--export-all", f"--base-path={repos}"]
    first.host.start("git-daemon", [*daemon, f"--listen={first.host.address}", "--reuseaddr"])

    argv = [
        "server",
        "add",
        second.host.address,
        "--root",
        str(first.tree),
        "--name",
        "edge2",
        *service_args(),
    ]
    argv += ["--identity", str(lab.client_key), "--known-hosts", str(known_hosts)]
    argv += ["--repo", f"git://{first.host.address}/repo"]
    dry = llmgw_steps(first.host, [*argv, "--dry-run"])
    assert dry["store-access"][0] == dry["controller"][0] == "skipped", dry
    assert not (second.changed / "etc" / "llmgw").exists(), "the dry run wrote something there"

    added = llmgw_steps(first.host, argv)
    assert added["packages"] == ("unchanged", "git installed"), (
        added
    )  # the cached tree has git (debian_tree.py)
    for step in ("store-access", "account", "certificates", "secrets", "config", "controller", "router"):
        assert added[step][0] == "changed", (step, added[step])
    assert second.host.address in added["certificates"][1]
    again = llmgw_steps(first.host, argv)
    assert {s for s, _ in again.values()} == {"unchanged"}, {
        k: v for k, v in again.items() if v[0] != "unchanged"
    }

    ca = ssl.create_default_context(cafile=str(first.changed / "etc" / "llmgw" / "tls" / "ca.crt"))
    assert _leads(first.host.address, ca) is True
    assert _leads(second.host.address, ca) is False  # a standby, verified against the cluster's CA
    first.host.run(["kill", pid_of(first, "controller")])
    wait_until(lambda: _leads(second.host.address, ca), 60, "the standby to take the lease over")
    # The standby reaches the store across the network over TLS alone (its pg_hba line is `hostssl`).
    query = (
        "SELECT count(*), bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
        f"WHERE a.client_addr = '{second.host.address}'"
    )
    as_postgres = ["chroot", str(first.tree), "runuser", "-u", "postgres", "--"]
    answer = first.host.run([*as_postgres, "psql", "-d", "llmgw", "-Atc", query])
    connections, all_tls = answer.strip().split("|")
    assert int(connections) >= 1 and all_tls == "t", (connections, all_tls)
