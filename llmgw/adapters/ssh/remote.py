"""SSH to a node: connect with the host key checked, run commands, compare and write files.

The words of every failure are for an operator: what happened, where, and what to do
("ssh: permission denied for llmgw@10.0.0.5:22"). Host keys are checked against the key pinned in the Node or a
known_hosts file; an unknown or different key is refused unless the caller explicitly asked for the insecure
option (tests and first contact on a trusted network only).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import socket
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# asyncssh names cryptography's DSA types in its annotations at import time; cryptography 51 deprecates DSA with a
# UserWarning that every `llmgw` command would print to an operator who can do nothing about it. Only that
# warning, only while asyncssh imports. llmgw never offers DSA keys (ssh-ed25519 and RSA only).
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh\.")
    import asyncssh

from llmgw.core.config.models import Node, SecretRef
from llmgw.core.config.secretrefs import SecretPolicy, SecretRefError, resolve, resolve_path
from llmgw.core.errors import LlmgwError


class StepFailed(LlmgwError):
    """A step could not be done; the message is what the operator reads."""


@dataclass(frozen=True)
class SshTarget:
    node: str
    host: str
    port: int
    user: str
    identity_file: Path | None = None
    identity_text: str | None = None  # key read from an environment variable
    host_key: str | None = None  # pinned `ssh-ed25519 AAAA...`
    known_hosts: Path | None = None
    insecure_accept_host_key: bool = False
    connect_timeout: float = 15.0
    serving_address: str | None = None  # where routers reach engines (default: host)
    serving_listen_all: bool = False  # the Node's explicit opt-in to listen on every address

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"

    def __repr__(self) -> str:  # never show key material
        return f"SshTarget({self.node!r}, {self.where})"


def _resolve(path: str, repo_root: Path) -> Path:
    expanded = Path(os.path.expanduser(path))
    return expanded if expanded.is_absolute() else repo_root / expanded


def target_for(
    node: Node,
    repo_root: Path,
    env: Mapping[str, str],
    *,
    secrets: SecretPolicy,
    insecure_accept_host_key: bool = False,
) -> SshTarget:
    """The SSH target a Node document describes. The identity is a secret reference, confined to the
    process's secrets directory and env prefix; `known_hosts` (public keys) is relative to the repo root."""
    spec = node.spec
    name = node.metadata.name
    if spec.local or not spec.address:
        raise StepFailed(f"node {name} is local: it needs no SSH bootstrap")
    ssh = spec.ssh
    identity_file: Path | None = None
    identity_text: str | None = None
    ref: SecretRef | None = ssh.identity if ssh else None
    try:
        if ref is not None and ref.file is not None:
            identity_file = resolve_path(ref, secrets)
        elif ref is not None and ref.env is not None:
            identity_text = resolve(ref, secrets, env)
    except SecretRefError as exc:
        raise StepFailed(f"ssh: node {name}'s identity (spec.ssh.identity): {exc}") from None
    known_hosts = _resolve(ssh.known_hosts, repo_root) if ssh and ssh.known_hosts else None
    return SshTarget(
        node=name,
        host=spec.address,
        port=ssh.port if ssh else 22,
        user=ssh.user if ssh else "llmgw",
        identity_file=identity_file,
        identity_text=identity_text,
        host_key=ssh.host_key if ssh else None,
        known_hosts=known_hosts,
        insecure_accept_host_key=insecure_accept_host_key,
        serving_address=spec.serving_address,
        serving_listen_all=spec.serving_listen_all,
    )


class _HostKeyRecorder(asyncssh.SSHClient):
    """Remembers the key the server presented when it was not trusted, to name it in the error."""

    def __init__(self) -> None:
        self.seen: asyncssh.SSHKey | None = None

    def validate_host_public_key(self, host: str, addr: str, port: int, key: asyncssh.SSHKey) -> bool:
        self.seen = key
        return False


def _trusted_keys(target: SshTarget) -> tuple[list[asyncssh.SSHKey], str]:
    """The keys the node may present, and where they came from (for the error message)."""
    if target.host_key:
        try:
            return [asyncssh.import_public_key(target.host_key)], "the key pinned in the Node"
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise StepFailed(f"node {target.node}: ssh.host_key is not a public key: {exc}") from exc
    path = target.known_hosts or Path.home() / ".ssh" / "known_hosts"
    if not path.exists():
        return [], f"{path} (missing)"
    try:
        matched = asyncssh.read_known_hosts(str(path)).match(target.host, target.host, target.port)
    except (OSError, ValueError) as exc:
        raise StepFailed(f"ssh: cannot read known_hosts {path}: {exc}") from exc
    return list(matched[0]), str(path)


def _client_keys(target: SshTarget) -> list[asyncssh.SSHKey] | None:
    if target.identity_text is not None:
        try:
            return [asyncssh.import_private_key(target.identity_text)]
        except (asyncssh.KeyImportError, ValueError) as exc:
            raise StepFailed(f"ssh: node {target.node}'s identity is not a private key: {exc}") from exc
    if target.identity_file is not None:
        try:
            return [asyncssh.read_private_key(str(target.identity_file))]
        except FileNotFoundError:
            raise StepFailed(f"ssh: identity file {target.identity_file} not found") from None
        except (OSError, asyncssh.KeyImportError, ValueError) as exc:
            raise StepFailed(f"ssh: cannot read identity file {target.identity_file}: {exc}") from exc
    return None  # asyncssh then uses the controller user's default keys and agent


async def connect(target: SshTarget) -> asyncssh.SSHClientConnection:
    """Connect and authenticate, or raise StepFailed with the reason in an operator's words."""
    client_keys = _client_keys(target)
    recorder = _HostKeyRecorder()
    if target.insecure_accept_host_key:
        known_hosts: object = None
        trusted: list[asyncssh.SSHKey] = []
        source = ""
    else:
        trusted, source = _trusted_keys(target)
        known_hosts = (trusted, [], [])
    try:
        return await asyncio.wait_for(
            asyncssh.connect(
                target.host,
                target.port,
                username=target.user,
                client_keys=client_keys,
                known_hosts=known_hosts,
                client_factory=lambda: recorder,
                agent_path=None if client_keys else (),
                connect_timeout=target.connect_timeout,
                login_timeout=target.connect_timeout,
                # Only the configured key: trying every key in ~/.ssh can lock an account out.
                preferred_auth="publickey",
                config=[],
            ),
            target.connect_timeout + 5,
        )
    except asyncssh.HostKeyNotVerifiable:
        got = recorder.seen.get_fingerprint("sha256") if recorder.seen else "an unreadable key"
        if not trusted:
            raise StepFailed(
                f"host key for {target.host} is unknown: no key for it in {source}; got {got}. "
                "Pin it in the Node's ssh.host_key or add it to known_hosts"
            ) from None
        expected = ", ".join(k.get_fingerprint("sha256") for k in trusted)
        raise StepFailed(
            f"host key mismatch for {target.host}: expected {expected} ({source}), got {got}"
        ) from None
    except asyncssh.PermissionDenied:
        raise StepFailed(f"ssh: permission denied for {target.where}") from None
    except ConnectionRefusedError:
        raise StepFailed(f"ssh: connection refused at {target.host}:{target.port}") from None
    except socket.gaierror as exc:
        raise StepFailed(f"ssh: cannot resolve {target.host}: {exc.strerror}") from None
    except (TimeoutError, asyncssh.ConnectionLost):
        raise StepFailed(
            f"ssh: no answer from {target.host}:{target.port} within {target.connect_timeout:g}s"
        ) from None
    except asyncssh.DisconnectError as exc:
        raise StepFailed(f"ssh: {target.where} closed the connection: {exc.reason}") from None
    except OSError as exc:
        raise StepFailed(f"ssh: cannot reach {target.host}:{target.port}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class RemoteFile:
    path: str
    data: bytes
    mode: int

    @property
    def state(self) -> tuple[str, int]:
        """(sha256, permission bits) as `file_states` reports a file already so: nothing to write."""
        return hashlib.sha256(self.data).hexdigest(), self.mode


class Remote:
    """Commands and files on a connected node. Every method raises StepFailed with the command's words."""

    def __init__(self, conn: asyncssh.SSHClientConnection, target: SshTarget) -> None:
        self.conn = conn
        self.target = target

    async def run(self, command: str, *, check: bool = True, input: str | None = None) -> str:
        result = await self.conn.run(command, check=False, input=input)
        out = str(result.stdout or "")
        if check and result.exit_status != 0:
            err = (str(result.stderr or "") or out).strip().splitlines()
            detail = err[-1] if err else f"exit status {result.exit_status}"
            raise StepFailed(f"on {self.target.node}: `{command.split()[0]}` failed: {detail}")
        return out

    async def status(self, command: str) -> tuple[int, str]:
        """Exit status and combined output, for commands whose failure is an answer."""
        result = await self.conn.run(command + " 2>&1", check=False)
        return int(result.exit_status or 0), str(result.stdout or "")

    async def file_states(self, paths: list[str]) -> dict[str, tuple[str, int]]:
        """sha256 and permission bits of those of `paths` that exist."""
        if not paths:
            return {}
        script = (
            "for f in " + " ".join(shlex.quote(p) for p in paths) + '; do if [ -f "$f" ]; then '
            'echo "$(sha256sum < "$f" | cut -d" " -f1) $(stat -c %a "$f") $f"; fi; done'
        )
        states: dict[str, tuple[str, int]] = {}
        for line in (await self.run(script)).splitlines():
            sha, mode, path = line.split(" ", 2)
            states[path] = (sha, int(mode, 8))
        return states

    async def put(self, file: RemoteFile) -> None:
        """Write a file atomically, created with its final mode (secrets are never briefly readable)."""
        await self.put_many([file])

    async def put_many(self, files: list[RemoteFile], parallel: int = 4) -> None:
        """Write files as `put` does, over one shell command and one SFTP session, `parallel` at a time.

        Each shell command is a fork on the node and each file a round trip: one by one, the forty wheels of a
        bootstrap took a second each on a busy node.
        """
        if not files:
            return
        parents = sorted({f.path.rsplit("/", 1)[0] or "/" for f in files})
        tmps = [f.path + ".llmgw-tmp" for f in files]
        await self.run(
            "mkdir -p "
            + " ".join(map(shlex.quote, parents))
            + " && rm -f "
            + " ".join(map(shlex.quote, tmps))
        )
        gate = asyncio.Semaphore(parallel)
        async with self.conn.start_sftp_client() as sftp:

            async def write(file: RemoteFile, tmp: str) -> None:
                async with gate:
                    attrs = asyncssh.SFTPAttrs(permissions=file.mode)
                    async with sftp.open(tmp, "wb", attrs) as fh:
                        await fh.write(file.data)
                    await sftp.chmod(tmp, file.mode)
                    await sftp.posix_rename(tmp, file.path)

            async with asyncio.TaskGroup() as group:
                for file, tmp in zip(files, tmps, strict=True):
                    group.create_task(write(file, tmp))

    async def sync_files(self, files: list[RemoteFile]) -> list[str]:
        """Write the files whose content or mode differs; returns the paths written (empty: unchanged)."""
        states = await self.file_states([f.path for f in files])
        changed = [f for f in files if states.get(f.path) != f.state]
        await self.put_many(changed)
        return [f.path for f in changed]
