"""Who a connection to the API listener is from, and the caps on connections not yet authenticated (H6).

An anonymous client must not hold descriptors until the router can accept nothing else: connections that no
request with a valid key has come on yet are capped per client address and in all, and at a cap the oldest
such connection is closed to admit the new one (an attacker's idle sockets go first; a real client's fresh
connection authenticates with its first request and stops counting). Behind a load balancer every client
shares its address, so connections from `trusted_proxies` are never capped by their own address: the client
they name in X-Forwarded-For (else Forwarded) is counted once a request's head says who it is.

The decisions are here as plain functions and one bookkeeping class; listener.py calls them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from llmgw.core.config.specs.listener_spec import ListenerSettings
from llmgw.core.words import parse_duration
from llmgw_router.server.exchange import Headers

__all__ = ["BODY_MIN_RATE", "ConnectionRules", "SnapshotRules", "Unauthenticated", "forwarded_client"]

BODY_MIN_RATE = 16 * 1024  # bytes a second a body must average past `body_timeout` (ListenerSettings)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class ConnectionRules:
    """ListenerSettings as the listener uses them: seconds, counts, parsed networks."""

    body_timeout: float = 30.0
    max_unauthenticated: int = 4096
    max_unauthenticated_per_peer: int = 256
    trusted_proxies: tuple[Network, ...] = ()

    @classmethod
    def of(cls, settings: ListenerSettings) -> ConnectionRules:
        return cls(
            parse_duration(settings.body_timeout, positive=True),
            settings.max_unauthenticated,
            settings.max_unauthenticated_per_peer,
            tuple(ipaddress.ip_network(n, strict=False) for n in settings.trusted_proxies),
        )

    def trusted(self, address: str | None) -> bool:
        """Whether `address` is one of the trusted proxies (False for no address or not an IP)."""
        if not self.trusted_proxies or address is None:
            return False
        ip = _address(address)
        return ip is not None and any(ip in net for net in self.trusted_proxies)


def _address(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("["):  # Forwarded: for="[2001:db8::1]:4711"
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:  # an IPv4 address with a port
        text = text.partition(":")[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return mapped or ip


def _forwarded_for(value: str) -> list[str]:
    """The `for=` addresses of an RFC 7239 Forwarded value, first hop first."""
    found: list[str] = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, given = pair.strip().partition("=")
            if name.strip().lower() == "for":
                found.append(given.strip().strip('"'))
    return found


def forwarded_client(headers: Headers, rules: ConnectionRules) -> str | None:
    """The client a trusted proxy forwarded a request for: walking the chain from the nearest hop back, the
    first address that is not itself a trusted proxy (the ones before it were written by whoever sent the
    request, and may be anything). None when the request names no address this way."""
    chain: list[str] = []
    xff = headers.get("x-forwarded-for")
    if xff:
        chain = [part.strip() for part in xff.split(",")]
    else:
        forwarded = headers.get("forwarded")
        if forwarded:
            chain = _forwarded_for(forwarded)
    parsed = [_address(part) for part in chain]
    for ip in reversed(parsed):
        if ip is None:
            return None  # garbage nearer than any real address: nothing in the chain can be believed
        if not any(ip in net for net in rules.trusted_proxies):
            return str(ip)
    return str(parsed[0]) if parsed else None  # every hop a trusted proxy: the first one is the client


class SnapshotRules:
    """The current snapshot's listener settings as ConnectionRules, parsed once per snapshot."""

    def __init__(self, settings: Callable[[], ListenerSettings | None]) -> None:
        self._settings = settings
        self._seen: ListenerSettings | None = None
        self._rules = ConnectionRules()

    def __call__(self) -> ConnectionRules:
        settings = self._settings()
        if settings is not None and settings is not self._seen:
            self._seen = settings
            self._rules = ConnectionRules.of(settings)
        return self._rules


C = TypeVar("C", bound=Hashable)


class Unauthenticated(Generic[C]):
    """Connections not yet authenticated, per peer and in all, each group in the order it was counted."""

    def __init__(self) -> None:
        self._peer_of: dict[C, str] = {}  # every counted connection, oldest first
        self._by_peer: dict[str, dict[C, None]] = {}

    def __len__(self) -> int:
        return len(self._peer_of)

    def count(self, peer: str) -> int:
        return len(self._by_peer.get(peer, ()))

    def admit(self, conn: C, peer: str, per_peer: int, total: int) -> list[C]:
        """Count `conn` under `peer` (again, if it was counted under another); the connections to close to
        stay within the caps, oldest first (never `conn` itself)."""
        self.discard(conn)
        evicted: list[C] = []
        while self.count(peer) >= per_peer:
            evicted.append(oldest := next(iter(self._by_peer[peer])))
            self.discard(oldest)
        while len(self._peer_of) >= total:
            evicted.append(oldest := next(iter(self._peer_of)))
            self.discard(oldest)
        self._peer_of[conn] = peer
        self._by_peer.setdefault(peer, {})[conn] = None
        return evicted

    def discard(self, conn: C) -> None:
        peer = self._peer_of.pop(conn, None)
        if peer is None:
            return
        group = self._by_peer[peer]
        del group[conn]
        if not group:
            del self._by_peer[peer]
