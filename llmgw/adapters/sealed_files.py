"""Files sealed with a passphrase: the secrets a backup carries beside the store (the secrets directory, the
cluster CA, the controller's own keys), readable only by whoever holds the passphrase.

The sealed form is `MAGIC | salt (16) | nonce (12) | AES-256-GCM(tar of the files)`, the key derived from the
passphrase with scrypt (n=2**15, r=8, p=1: a guess costs 32 MiB and tens of milliseconds). GCM authenticates
the whole archive: a wrong passphrase or a changed byte is refused, never half-restored. Each entry keeps its
absolute path and mode, so a restore puts the files back where the controller's settings look for them.
"""

from __future__ import annotations

import io
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from llmgw.core.errors import LlmgwError

MAGIC = b"LLMGW-SEALED-1\n"
_SALT = 16
_NONCE = 12
PASSPHRASE_ENV = "LLMGW_BACKUP_PASSPHRASE"


class SealedFilesError(LlmgwError):
    """A sealed archive that cannot be made or opened; the message says which file and why."""


@dataclass(frozen=True)
class SealedEntry:
    """One file taken out of a sealed archive, not yet written."""

    path: Path  # absolute, where it was found
    mode: int
    content: bytes


def read_passphrase(passphrase_file: Path | None, environ: dict[str, str] | os._Environ[str]) -> bytes:
    """The operator's passphrase: from `passphrase_file` (its first line), else ${PASSPHRASE_ENV}."""
    if passphrase_file is not None:
        try:
            text = passphrase_file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise SealedFilesError(
                f"cannot read --passphrase-file {passphrase_file}: {exc.strerror}"
            ) from exc
        value = text[0].strip() if text else ""
        where = f"--passphrase-file {passphrase_file}"
    else:
        value = environ.get(PASSPHRASE_ENV, "").strip()
        where = PASSPHRASE_ENV
        if not value:
            raise SealedFilesError(
                f"no passphrase: give --passphrase-file FILE or set {PASSPHRASE_ENV} (the secrets in a backup "
                "are sealed with it; keep it apart from the backups)"
            )
    if len(value) < 12:
        raise SealedFilesError(f"the passphrase from {where} is {len(value)} characters: use 12 or more")
    return value.encode()


def _key(passphrase: bytes, salt: bytes) -> bytes:
    return Scrypt(salt=salt, length=32, n=2**15, r=8, p=1).derive(passphrase)


def seal(paths: list[Path], passphrase: bytes) -> bytes:
    """The files under `paths` (directories whole, files as they are; absolute paths kept), sealed."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in paths:
            absolute = path.expanduser().resolve()
            if not absolute.exists():
                raise SealedFilesError(f"{absolute} does not exist: nothing to seal there")
            tar.add(str(absolute), arcname=str(absolute).lstrip("/"), recursive=True)
    salt, nonce = os.urandom(_SALT), os.urandom(_NONCE)
    return MAGIC + salt + nonce + AESGCM(_key(passphrase, salt)).encrypt(nonce, buffer.getvalue(), MAGIC)


def unseal(sealed: bytes, passphrase: bytes) -> list[SealedEntry]:
    """The regular files of a sealed archive; a wrong passphrase or a damaged archive is an error."""
    if not sealed.startswith(MAGIC):
        raise SealedFilesError("not a sealed llmgw archive (its first line is not the llmgw seal)")
    body = sealed[len(MAGIC) :]
    salt, nonce, ciphertext = body[:_SALT], body[_SALT : _SALT + _NONCE], body[_SALT + _NONCE :]
    try:
        plain = AESGCM(_key(passphrase, salt)).decrypt(nonce, ciphertext, MAGIC)
    except InvalidTag:
        raise SealedFilesError(
            "the sealed secrets do not open with this passphrase (a different passphrase, or a damaged file)"
        ) from None
    entries: list[SealedEntry] = []
    with tarfile.open(fileobj=io.BytesIO(plain), mode="r") as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            extracted = tar.extractfile(member)
            if extracted is None:
                continue
            if ".." in Path(member.name).parts:  # sealed by us from resolved paths: never there
                raise SealedFilesError(
                    f"the sealed archive names {member.name!r}, outside any path it sealed"
                )
            entries.append(SealedEntry(Path("/") / member.name, member.mode & 0o7777, extracted.read()))
    return entries


def check_clashes(entries: list[SealedEntry], *, replace: bool) -> None:
    """Refuse (unless `replace`) when a file to restore exists with other content: said before anything is
    written, so a refused restore leaves the store and the files as they were."""
    clashes = [e.path for e in entries if e.path.exists() and e.path.read_bytes() != e.content]
    if clashes and not replace:
        listed = ", ".join(str(p) for p in clashes[:5])
        raise SealedFilesError(
            f"{len(clashes)} file(s) to restore exist with other content ({listed}): give --replace to "
            "overwrite them, or restore on a machine without them"
        )


def write_entries(entries: list[SealedEntry], *, replace: bool) -> list[Path]:
    """Put the files back at their paths, with their modes (directories made 0700); the paths written."""
    check_clashes(entries, replace=replace)
    for entry in entries:
        entry.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(entry.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, entry.mode or 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(entry.content)
        os.chmod(entry.path, entry.mode or 0o600)
    return [e.path for e in entries]
