"""The machine `llmgw server init` runs on, with the same calls as a node over SSH (llmgw.adapters.ssh.remote):
commands, file states, atomic writes. With a root other than `/` (a Debian tree, in tests), files are read and
written under it and commands run in it through `chroot`.
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import os
import socket
import subprocess
from pathlib import Path

from llmgw.adapters.ssh.remote import RemoteFile, StepFailed

_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "DEBIAN_FRONTEND": "noninteractive",
}


class Machine:
    """Commands and files on this machine (under `root`). Every method raises StepFailed with the words."""

    def __init__(self, root: Path = Path("/")) -> None:
        self.root = root.absolute()

    @property
    def chrooted(self) -> bool:
        return self.root != Path("/")

    @property
    def systemd(self) -> bool:
        """Whether systemd runs this machine (never the tree under another root)."""
        return not self.chrooted and Path("/run/systemd/system").is_dir()

    def path(self, path: str) -> Path:
        """Where the machine's `path` is from here."""
        return self.root / path.lstrip("/")

    def _argv(self, command: str) -> list[str]:
        shell = ["/bin/sh", "-c", command]
        return ["chroot", str(self.root), *shell] if self.chrooted else shell

    async def _exec(self, command: str, input: str | None, merge: bool) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *self._argv(command),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge else subprocess.PIPE,
            env={**_ENV, "HOME": "/root"},
        )
        out, err = await proc.communicate(input.encode() if input is not None else None)
        assert proc.returncode is not None
        return proc.returncode, out.decode(errors="replace"), (err or b"").decode(errors="replace")

    async def run(self, command: str, *, check: bool = True, input: str | None = None) -> str:
        code, out, err = await self._exec(command, input, merge=False)
        if check and code != 0:
            lines = (err or out).strip().splitlines()
            detail = lines[-1] if lines else f"exit status {code}"
            raise StepFailed(f"`{command.split()[0]}` failed: {detail}")
        return out

    async def status(self, command: str, input: str | None = None) -> tuple[int, str]:
        """Exit status and combined output, for commands whose failure is an answer."""
        code, out, _ = await self._exec(command, input, merge=True)
        return code, out

    async def file_states(self, paths: list[str]) -> dict[str, tuple[str, int]]:
        """sha256 and permission bits of those of `paths` that exist."""
        states: dict[str, tuple[str, int]] = {}
        for p in paths:
            local = self.path(p)
            if local.is_file():
                states[p] = (hashlib.sha256(local.read_bytes()).hexdigest(), local.stat().st_mode & 0o7777)
        return states

    async def put(self, file: RemoteFile) -> None:
        await self.put_many([file])

    async def put_many(self, files: list[RemoteFile]) -> None:
        """Write each file atomically, created with its final mode (a secret is never briefly readable)."""
        for f in files:
            local = self.path(f.path)
            local.parent.mkdir(parents=True, exist_ok=True)
            tmp = local.with_name(local.name + ".llmgw-tmp")
            tmp.unlink(missing_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, f.mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(f.data)
            os.chmod(tmp, f.mode)
            os.replace(tmp, local)

    async def sync_files(self, files: list[RemoteFile]) -> list[str]:
        """Write the files whose content or mode differs; returns the paths written (empty: unchanged)."""
        states = await self.file_states([f.path for f in files])
        changed = [f for f in files if states.get(f.path) != f.state]
        await self.put_many(changed)
        return [f.path for f in changed]

    def read_text(self, path: str) -> str | None:
        """The machine's file, or None when it is absent."""
        try:
            return self.path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None


def machine_addresses() -> list[str]:
    """Every address and name this machine is reached by (`addresses_from`)."""
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return addresses_from(out, [socket.gethostname(), socket.getfqdn()])


def addresses_from(ip_addr_output: str, names: list[str]) -> list[str]:
    """The addresses in `ip -o addr show`'s output (link-local left out: they need a zone), loopback, and the
    machine's names: what a machine's certificate covers, here or over SSH (`llmgw server add`)."""
    found: set[str] = {"127.0.0.1", "::1", "localhost"}
    for line in ip_addr_output.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[2] in ("inet", "inet6"):
            addr = ipaddress.ip_address(fields[3].split("/")[0])
            if not addr.is_link_local:
                found.add(str(addr))
    found.update(n for n in names if n)
    return sorted(found)


def first_routable_ipv4(addresses: list[str]) -> str:
    """The address others dial by default: the machine's first IPv4 address beyond loopback (a bare IPv6 one
    would need brackets in every host:port), else loopback (one machine)."""
    for a in addresses:
        try:
            ip = ipaddress.ip_address(a)
        except ValueError:
            continue  # a name
        if ip.version == 4 and not (ip.is_loopback or ip.is_unspecified or ip.is_link_local):
            return a
    return "127.0.0.1"
