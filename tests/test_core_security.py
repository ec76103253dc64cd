"""llmgw.core.security parses the legacy numeric IPv4 forms itself (the core imports no socket): its parser must
agree with the libc inet_aton that getaddrinfo uses, or a metadata address written as a number slips through."""

from __future__ import annotations

import ipaddress
import itertools
import socket

from llmgw.core.security import _NUMERIC_PART, _inet_aton_form, forbidden_address_reason

PARTS = [
    "0",
    "1",
    "00",
    "007",
    "08",
    "09",
    "0x",
    "0X0",
    "0xff",
    "0x100",
    "0x0000000ff",
    "0377",
    "0400",
    "255",
    "256",
    "65535",
    "65536",
    "16777215",
    "16777216",
    "4294967295",
    "4294967296",
    "0xFFFFFFFF",
    "0251",
    "0376",
    "43518",
]


def libc(host: str) -> ipaddress.IPv4Address | None:
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_PART.fullmatch(p) for p in parts):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def test_inet_aton_form_agrees_with_libc_on_every_short_form() -> None:
    hosts = [".".join(c) for k in (1, 2, 3) for c in itertools.product(PARTS, repeat=k)]
    hosts += [".".join(c) for c in itertools.product(PARTS[::3], repeat=4)]
    differing = [(h, libc(h), _inet_aton_form(h)) for h in hosts if libc(h) != _inet_aton_form(h)]
    assert not differing, differing[:5]
    assert sum(libc(h) is not None for h in hosts) > 1000  # the grid really exercises accepted forms


def test_metadata_address_as_numbers_is_still_forbidden() -> None:
    for host in ("2852039166", "0251.0376.0251.0376", "169.254.43518", "0xa9fea9fe", "0xa9.0xfe.0xa9fe"):
        assert forbidden_address_reason(host) == "169.254.169.254 is a cloud metadata service address", host
