"""`llmgw server add`'s decisions that need no second machine: the store's DSN as the other machine dials it, the
PostgreSQL lines that let it in (its address alone, its role alone, by password), the settings a standby and its
router are given, and the refusals of a first machine it cannot make a standby of (no lease, a repo only it can
read, init never ran), and the command's help.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from ruamel.yaml import YAML
from typer.testing import CliRunner

from llmgw.adapters.server import layout as L, store_access
from llmgw.adapters.server.add import Add
from llmgw.adapters.server.machine import Machine
from llmgw.adapters.server.options import AddOptions
from llmgw.adapters.ssh.remote import SshTarget, StepFailed
from llmgw.cli.main import app


def test_the_dsn_keeps_role_password_port_and_database_at_the_first_machines_address() -> None:
    dsn = "postgresql://llmgw:s3cret-Pw_x@127.0.0.1:5433/llmgw"
    assert store_access.is_local(dsn)
    assert (
        store_access.dsn_for(dsn, "10.0.0.5")
        == "postgresql://llmgw:s3cret-Pw_x@10.0.0.5:5433/llmgw?sslmode=require"
    )
    # Over the network the password goes over TLS only; a DSN that already says how keeps its word.
    verified = "postgresql://llmgw:pw@127.0.0.1/llmgw?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.crt"
    assert store_access.dsn_for(verified, "10.0.0.5") == verified.replace("127.0.0.1", "10.0.0.5:5432")
    assert not store_access.is_local("postgresql://llmgw:pw@db.example:5432/llmgw")


def test_postgresql_lets_in_one_address_one_role_by_password() -> None:
    assert store_access.hba_line("10.0.0.6") == "hostssl llmgw llmgw 10.0.0.6/32 scram-sha-256"
    assert store_access.hba_line("2001:db8::6") == "hostssl llmgw llmgw 2001:db8::6/128 scram-sha-256"
    with pytest.raises(ValueError):
        store_access.hba_line("standby.example")  # pg_hba takes addresses: the step asks for --advertise
    conf = store_access.listen_conf(["localhost", "10.0.0.5"]).decode()
    assert "listen_addresses = 'localhost, 10.0.0.5'" in conf


def _add(root: Path, **opts: object) -> Add:
    target = SshTarget(node="10.0.0.6", host="10.0.0.6", port=22, user="root")
    add = Add(Machine(root), AddOptions(target=target, bin_dir="/opt/llmgw/bin", **opts))  # type: ignore[arg-type]
    add.address = "10.0.0.6"
    return add


def _first_machine(root: Path, *, ha: bool, repo: str) -> None:
    """What `llmgw server init` leaves on a machine, as far as `server add` reads it."""
    lay = L.ServerLayout()
    s = L.ServerSettings(
        repo=repo, bin_dir="/opt/llmgw/bin", router_name="edge1", advertise="10.0.0.5", ha=ha
    )
    files = {
        lay.controller_config: L.controller_config(lay, s),
        lay.admin_token: b"admin\n",
        lay.cluster_secret: b"secret\n",
        lay.store_dsn: b"postgresql://llmgw:pw@127.0.0.1:5432/llmgw\n",
        f"{lay.ca_dir}/ca.key": b"key\n",
    }
    for path, data in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)


def _refusal(add: Add) -> str:
    with pytest.raises(StepFailed) as failed:
        asyncio.run(add.first_machine(None))  # type: ignore[arg-type]  # reads this machine only
    return str(failed.value)


def test_a_first_machine_without_init_without_a_lease_or_with_a_local_repo_is_refused(tmp_path: Path) -> None:
    assert "run `llmgw server init` on this machine first" in _refusal(_add(tmp_path))
    _first_machine(tmp_path, ha=False, repo="git://git.example/cluster")
    assert "holds no lease" in _refusal(_add(tmp_path))
    _first_machine(tmp_path, ha=True, repo="/var/lib/llmgw/repo")
    assert "a path on this machine the standby cannot reach" in _refusal(_add(tmp_path))
    assert "--repo" in _refusal(_add(tmp_path))
    # A router alone follows the controller here: the repo is none of its business.
    status, words = asyncio.run(_add(tmp_path, controller=False).first_machine(None))  # type: ignore[arg-type]
    assert status == "unchanged" and "10.0.0.5" in words


def test_a_standby_leases_and_its_router_follows_it_then_the_first(tmp_path: Path) -> None:
    _first_machine(tmp_path, ha=True, repo="git://10.0.0.5/repo")
    add = _add(tmp_path, name="edge2")
    asyncio.run(add.first_machine(None))  # type: ignore[arg-type]
    lay, s = add.lay, add.settings()
    controller = YAML(typ="safe").load(L.controller_config(lay, s))
    assert controller["ha"] is True and controller["advertise"] == "https://10.0.0.6:7070"
    assert controller["repo"] == "git://10.0.0.5/repo"
    router = YAML(typ="safe").load(L.router_config(lay, s))
    assert router["controller"] == ["https://10.0.0.6:7070", "https://10.0.0.5:7070"]
    assert router["router_id"] == "edge2"
    alone = _add(tmp_path, controller=False)
    asyncio.run(alone.first_machine(None))  # type: ignore[arg-type]
    assert YAML(typ="safe").load(L.router_config(lay, alone.settings()))["controller"] == [
        "https://10.0.0.5:7070"
    ]
    assert store_access.dsn_for(add.here.read_text(lay.store_dsn) or "", add.first_host).startswith(
        "postgresql://llmgw:pw@10.0.0.5:5432/"
    )


def test_the_command_explains_itself_and_refuses_a_bad_name() -> None:
    runner = CliRunner()
    shown = runner.invoke(app, ["server", "add", "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    for flag in ("--dry-run", "--known-hosts", "--no-controller", "--no-router", "--repo"):
        assert flag in shown.output, flag
    refused = runner.invoke(app, ["server", "add", "10.0.0.6", "--name", "Edge 2"])
    assert refused.exit_code != 0 and "--name 'Edge 2'" in refused.output, refused.output


def test_the_hba_line_is_added_once_and_replaces_the_plain_one_an_earlier_add_wrote() -> None:
    debian = "local all postgres peer\nhost all all 127.0.0.1/32 scram-sha-256\n"
    added = store_access.hba_admitting(debian, "10.0.0.6")
    assert added == debian + "hostssl llmgw llmgw 10.0.0.6/32 scram-sha-256\n"
    assert store_access.hba_admitting(added, "10.0.0.6") == added  # again: nothing to change
    earlier = (
        debian + "host llmgw llmgw 10.0.0.6/32 scram-sha-256\nhost llmgw llmgw 10.0.0.7/32 scram-sha-256\n"
    )
    upgraded = store_access.hba_admitting(earlier, "10.0.0.6")
    assert upgraded.splitlines() == [
        *debian.splitlines(),
        "host llmgw llmgw 10.0.0.7/32 scram-sha-256",  # another machine's: its own `server add` upgrades it
        "hostssl llmgw llmgw 10.0.0.6/32 scram-sha-256",
    ]


class _Conftool:
    """A machine whose `pg_conftool ... show ssl` answers `answer` with exit status `code`."""

    def __init__(self, code: int, answer: str) -> None:
        self.code, self.answer = code, answer
        self.asked: list[str] = []

    async def status(self, command: str) -> tuple[int, str]:
        self.asked.append(command)
        return self.code, self.answer


def test_a_cluster_without_tls_is_refused_before_a_line_is_written() -> None:
    """`hostssl` admits nobody where PostgreSQL serves no TLS: the step says what to set instead."""
    pg = store_access.PgCluster("15", "main", "5432")
    on = _Conftool(0, "on\n")
    asyncio.run(store_access.require_ssl(on, pg))  # type: ignore[arg-type]
    assert on.asked == ["pg_conftool --boolean --short 15 main show ssl"]
    for machine in (_Conftool(0, "off\n"), _Conftool(1, "")):
        with pytest.raises(StepFailed) as refused:
            asyncio.run(store_access.require_ssl(machine, pg))  # type: ignore[arg-type]
        assert "set `ssl = on` with a certificate in /etc/postgresql/15/main/postgresql.conf" in str(
            refused.value
        )
