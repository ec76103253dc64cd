"""The sealed secrets of a backup (llmgw.adapters.sealed_files): what goes in comes back with its path and mode,
and nothing comes back from a wrong passphrase, a changed byte, or over a file that differs unless told."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from llmgw.adapters.sealed_files import (
    PASSPHRASE_ENV,
    SealedFilesError,
    read_passphrase,
    seal,
    unseal,
    write_entries,
)

PASSPHRASE = b"a passphrase long enough"
# Long enough that random ciphertext cannot hold it by chance: a 3-byte marker once matched in CI.
TOKEN = b"token-9f3c1e7a5b2d4860-in-plain-text\n"


def _tree(root: Path) -> list[Path]:
    (root / "secrets" / "nested").mkdir(parents=True)
    (root / "secrets" / "nested" / "token").write_bytes(TOKEN)
    (root / "ca.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\n")
    os.chmod(root / "ca.key", 0o600)
    os.chmod(root / "secrets" / "nested" / "token", 0o640)
    return [root / "secrets", root / "ca.key"]


def test_sealed_files_come_back_where_they_were_with_their_modes(tmp_path: Path) -> None:
    sealed = seal(_tree(tmp_path), PASSPHRASE)
    assert TOKEN.strip() not in sealed and b"PRIVATE KEY" not in sealed
    entries = unseal(sealed, PASSPHRASE)
    assert {e.path: (e.content, e.mode) for e in entries} == {
        tmp_path / "secrets" / "nested" / "token": (TOKEN, 0o640),
        tmp_path / "ca.key": (b"-----BEGIN PRIVATE KEY-----\n", 0o600),
    }
    for e in entries:
        e.path.unlink()
    write_entries(entries, replace=False)
    assert (tmp_path / "secrets" / "nested" / "token").read_bytes() == TOKEN
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    write_entries(entries, replace=False)  # the same content already there: nothing to refuse


def test_wrong_passphrase_or_changed_byte_opens_nothing(tmp_path: Path) -> None:
    sealed = seal(_tree(tmp_path), PASSPHRASE)
    with pytest.raises(SealedFilesError, match="do not open with this passphrase"):
        unseal(sealed, b"another passphrase entirely")
    damaged = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealedFilesError, match="damaged"):
        unseal(damaged, PASSPHRASE)
    with pytest.raises(SealedFilesError, match="not a sealed llmgw archive"):
        unseal(b"PK\x03\x04" + sealed, PASSPHRASE)


def test_a_file_that_differs_is_overwritten_only_when_told(tmp_path: Path) -> None:
    entries = unseal(seal(_tree(tmp_path), PASSPHRASE), PASSPHRASE)
    (tmp_path / "ca.key").write_bytes(b"a newer key\n")
    with pytest.raises(SealedFilesError, match="--replace"):
        write_entries(entries, replace=False)
    assert (tmp_path / "ca.key").read_bytes() == b"a newer key\n"
    write_entries(entries, replace=True)
    assert (tmp_path / "ca.key").read_bytes() == b"-----BEGIN PRIVATE KEY-----\n"


def test_the_passphrase_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    with pytest.raises(SealedFilesError, match=PASSPHRASE_ENV):
        read_passphrase(None, {})
    assert read_passphrase(None, {PASSPHRASE_ENV: "from the environment"}) == b"from the environment"
    given = tmp_path / "pass"
    given.write_text("first line is it\nsecond is not\n")
    assert read_passphrase(given, {PASSPHRASE_ENV: "ignored when a file is given"}) == b"first line is it"
    given.write_text("short\n")
    with pytest.raises(SealedFilesError, match="12 or more"):
        read_passphrase(given, {})
    with pytest.raises(SealedFilesError, match="cannot read --passphrase-file"):
        read_passphrase(tmp_path / "missing", {})
