"""The store `llmgw server init` provisioned on this machine, opened to another control-plane machine
(`llmgw server add`): PostgreSQL listening on this machine's address besides loopback, and one pg_hba line letting
the llmgw role in from the other machine's address with its password (scram-sha-256), over TLS only (`hostssl`:
the connection carries every key's hash and every usage row). Nothing else is opened: other roles, databases and
addresses stay refused, and so does the llmgw role without TLS.

The other machine's DSN asks for TLS (`sslmode=require`): libpq's default, `prefer`, would go on in the clear
where TLS failed. It does not verify the server's certificate: Debian's cluster serves the machine's self-signed
`ssl-cert` one, which no CA vouches for (docs/operations.md says so).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from llmgw.adapters.server import layout as L
from llmgw.adapters.server.machine import Machine
from llmgw.adapters.server.steps import Act, Outcome
from llmgw.adapters.ssh.remote import RemoteFile, StepFailed

LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
CONF_NAME = "llmgw-network.conf"  # in the cluster's conf.d, which Debian's postgresql.conf includes


@dataclass(frozen=True)
class PgCluster:
    version: str
    name: str
    port: str

    @property
    def etc(self) -> str:
        return f"/etc/postgresql/{self.version}/{self.name}"

    def restart_command(self, systemd: bool) -> str:
        if systemd:
            return f"systemctl restart postgresql@{self.version}-{self.name}"
        return f"pg_ctlcluster {self.version} {self.name} restart"


def dsn_for(dsn: str, host: str) -> str:
    """The same role, password and database, reached at `host` (the address the other machine dials), over
    TLS (`sslmode=require`, unless the DSN already says how)."""
    parts = urlsplit(dsn)
    userinfo, _, hostport = parts.netloc.rpartition("@")
    port = hostport.rsplit(":", 1)[1] if ":" in hostport else "5432"
    query = parse_qsl(parts.query)
    if not any(key == "sslmode" for key, _ in query):
        query.append(("sslmode", "require"))
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}:{port}", query=urlencode(query)))


def is_local(dsn: str) -> bool:
    return (urlsplit(dsn).hostname or "") in LOCAL_HOSTS


def hba_line(address: str, kind: str = "hostssl") -> str:
    ip = ipaddress.ip_address(address)
    return f"{kind} {L.USER} {L.USER} {ip}/{ip.max_prefixlen} scram-sha-256"


def hba_admitting(hba: str, address: str) -> str:
    """pg_hba.conf's text letting `address` in over TLS: the `hostssl` line appended where missing, and the
    plain `host` line an earlier `server add` wrote for the same address dropped (pg_hba takes the first line
    that matches, so it would go on letting the llmgw role in without TLS)."""
    plain, line = hba_line(address, "host"), hba_line(address)
    kept = [existing for existing in hba.splitlines() if existing != plain]
    if line not in kept:
        kept.append(line)
    return "\n".join(kept) + "\n"


def listen_conf(listen: list[str]) -> bytes:
    quoted = ", ".join(listen)
    return f"# llmgw server add: other control-plane machines reach the store here\nlisten_addresses = '{quoted}'\n".encode()


async def local_cluster(m: Machine) -> PgCluster:
    code, out = await m.status("pg_lsclusters -h")
    clusters = [line.split() for line in out.splitlines() if line.strip()] if code == 0 else []
    if not clusters:
        raise StepFailed(
            f"no PostgreSQL cluster on this machine (pg_lsclusters: {out.strip()[-200:] or code})"
        )
    version, name, port = clusters[0][:3]
    return PgCluster(version, name, port)


async def require_ssl(m: Machine, pg: PgCluster) -> None:
    """A `hostssl` line admits nobody where the cluster serves no TLS: refuse, saying what to change, rather
    than open a store the other machine then cannot reach (or reaches in the clear)."""
    code, out = await m.status(f"pg_conftool --boolean --short {pg.version} {pg.name} show ssl")
    if code != 0 or out.strip() != "on":
        raise StepFailed(
            f"PostgreSQL {pg.version}/{pg.name} serves no TLS (ssl: {out.strip() or 'not set'}), and the other "
            "machine's store traffic (key hashes, usage rows) would cross the network in the clear: set "
            f"`ssl = on` with a certificate in {pg.etc}/postgresql.conf (Debian's default, with the ssl-cert "
            "package) and run again"
        )


async def open_store(m: Machine, here: str, other: str, systemd: bool, act: Act) -> Outcome:
    """PostgreSQL on this machine listening on `here` too and letting `other` in as the llmgw role, over TLS."""
    pg = await local_cluster(m)
    await require_ssl(m, pg)
    conf_path = f"{pg.etc}/conf.d/{CONF_NAME}"
    conf = RemoteFile(conf_path, listen_conf(["localhost", here]), 0o644)
    hba_path = f"{pg.etc}/pg_hba.conf"
    hba = m.read_text(hba_path)
    if hba is None:
        raise StepFailed(f"{hba_path} not found: is PostgreSQL {pg.version}/{pg.name} Debian's?")
    line = hba_line(other)
    listening = (await m.file_states([conf_path])).get(conf_path, ("", 0))[0] == conf.state[0]
    wanted = hba_admitting(hba, other)
    admitted = wanted.splitlines() == hba.splitlines()
    where = f"PostgreSQL {pg.version}/{pg.name} listens on {here}:{pg.port}"
    if listening and admitted:
        return "unchanged", f"{where}, lets {L.USER} in from {other}"

    async def open_() -> None:
        if not admitted:
            await m.put(RemoteFile(hba_path, wanted.encode(), 0o640))
            await m.run(f"chown postgres:postgres {hba_path}")
        if not listening:
            await m.put(conf)
            await m.run(pg.restart_command(systemd))  # a new listen address needs a restart
        else:
            await m.run(f"pg_ctlcluster {pg.version} {pg.name} reload")

    return await act(f"make {where} and let {L.USER} in from {other} ({line})", open_)
