"""People's console passwords (issue 44): hashed with scrypt from the standard library, checked in constant time,
and a person's failed sign-ins held to a few a window. Pure: the store keeps the encoded hash, the console asks.

Encoded as `scrypt$N$r$p$SALT$HASH` (base64), so a later change of cost still reads the hashes made before it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from llmgw.core.errors import LlmgwError

__all__ = [
    "FAILURES_ALLOWED",
    "FAILURE_WINDOW_S",
    "MIN_LENGTH",
    "PasswordError",
    "hash_password",
    "held_back",
    "password_problem",
    "verify_password",
]

# scrypt's cost: N=2^15, r=8 takes 32 MiB and tens of milliseconds a try (RFC 7914's interactive figure).
N, R, P = 2**15, 8, 1
MAX_MEM = 64 * 1024 * 1024
SALT_BYTES, HASH_BYTES = 16, 32
MIN_LENGTH = 12
MAX_LENGTH = 1024  # hashing a megabyte per try is no password, and a way to burn CPU
FAILURES_ALLOWED = 5  # a person's failed sign-ins in FAILURE_WINDOW_S; then they wait for the window to pass
FAILURE_WINDOW_S = 300.0


class PasswordError(LlmgwError):
    """A stored password hash that cannot be read (not one this llmgw wrote)."""


def password_problem(password: str, again: str) -> str | None:
    """What is wrong with a new password, or None."""
    if password != again:
        return "the two passwords differ: type the same one twice"
    if len(password) < MIN_LENGTH:
        return f"a password has at least {MIN_LENGTH} characters (a few words make a good one)"
    if len(password) > MAX_LENGTH:
        return f"a password has at most {MAX_LENGTH} characters"
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(password.encode(), salt=salt, n=N, r=R, p=P, maxmem=MAX_MEM, dklen=HASH_BYTES)
    return f"scrypt${N}${R}${P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, encoded: str) -> bool:
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise PasswordError("a stored console password is not an scrypt hash llmgw wrote: set it again")
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, want = base64.b64decode(parts[4]), base64.b64decode(parts[5])
    except ValueError:
        raise PasswordError("a stored console password hash is damaged: set it again") from None
    if len(password) > MAX_LENGTH:
        return False
    got = hashlib.scrypt(password.encode(), salt=salt, n=n, r=r, p=p, maxmem=MAX_MEM, dklen=len(want))
    return hmac.compare_digest(got, want)


def held_back(failures: list[float], now: float) -> float | None:
    """Seconds until the person may try again, or None: at FAILURES_ALLOWED failures within FAILURE_WINDOW_S
    they wait until the oldest of those leaves the window. `failures`: their failed attempts' times."""
    recent = sorted(t for t in failures if now - t < FAILURE_WINDOW_S)
    if len(recent) < FAILURES_ALLOWED:
        return None
    return recent[-FAILURES_ALLOWED] + FAILURE_WINDOW_S - now
