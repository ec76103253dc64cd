"""Small security primitives shared by the controller, the agent's launcher and the router.

Engine keys are derived, not stored: the router must send the right key to replicas it never saw start
(adopted after a controller restart, placed by another controller), and an HMAC of the replica id under the
cluster secret gives that without a table to keep in step. A key taken from one node opens that replica only
(and a replica's id is never reused, so the keys a torn-down node held open nothing once its replicas stop).

Node and router tokens are derived the same way, each under its own label so no token is another's key: a node
token names one node (and a generation the controller bumps when it tears the node down), the router token
opens the router stream. A node never holds the router token, the cluster secret or another node's token.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from urllib.parse import urlsplit

__all__ = [
    "ENGINE_KEY_PREFIX",
    "NODE_TOKEN_PREFIX",
    "ROUTER_TOKEN_PREFIX",
    "bearer_token",
    "engine_key",
    "forbidden_address_reason",
    "is_loopback_host",
    "node_token",
    "router_token",
]

ENGINE_KEY_PREFIX = "llmgw-ek-"
NODE_TOKEN_PREFIX = "llmgw-nt-"
ROUTER_TOKEN_PREFIX = "llmgw-rt-"

# Cloud metadata services answer on these addresses; a URL from the cluster repo must never reach them
# through the router (it would hand the instance's credentials to whoever can edit a provider URL).
_METADATA_HOSTS = frozenset(
    {"metadata.google.internal", "metadata.azure.internal", "metadata", "instance-data"}
)
_METADATA_ADDRESSES = (
    ipaddress.ip_address("169.254.169.254"),
    ipaddress.ip_address("fd00:ec2::254"),
    ipaddress.ip_address("100.100.100.200"),  # Alibaba Cloud
)


_NUMERIC_PART = re.compile(r"0[xX][0-9a-fA-F]*|[0-9]+")


def engine_key(cluster_secret: bytes, replica_id: str) -> str:
    """The key replica `replica_id`'s engine demands: HMAC-SHA256 of the id under the secret, hex, prefixed."""
    if not cluster_secret:
        raise ValueError("engine_key needs a non-empty cluster secret")
    digest = hmac.new(cluster_secret, replica_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return ENGINE_KEY_PREFIX + digest


def _inet_aton_form(host: str) -> ipaddress.IPv4Address | None:
    """The address of a legacy numeric IPv4 form (decimal `2852039166`, octal or hex parts, `a.b.c` short
    forms) that getaddrinfo connects to though ipaddress refuses it; None for anything else.

    inet_aton(3)'s grammar, written out so the core imports no socket: each part is hex after 0x, octal after
    a leading 0, else decimal; the last part fills all the bytes the earlier parts (one byte each) leave.
    """
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_NUMERIC_PART.fullmatch(p) for p in parts):
        return None
    values = []
    for part in parts:
        if part[:2] in ("0x", "0X"):
            if len(part) == 2:  # a bare 0x is no number to inet_aton
                return None
            values.append(int(part[2:], 16))
        elif part.startswith("0") and len(part) > 1:
            if not set(part) <= set("01234567"):
                return None
            values.append(int(part, 8))
        else:
            values.append(int(part))
    *leading, last = values
    if any(v > 0xFF for v in leading) or last >= 1 << (8 * (4 - len(leading))):
        return None
    number = last
    for index, value in enumerate(leading):
        number |= value << (8 * (3 - index))
    return ipaddress.IPv4Address(number)


def node_token(cluster_secret: bytes, node: str, generation: int = 0) -> str:
    """The bearer token node `node`'s agent presents: it opens the agent hub for that node name only.

    `generation` is bumped when the node is torn down, so the token a removed machine kept is refused even
    if a node of the same name is declared (and bootstrapped with the next generation's token) later."""
    if not cluster_secret:
        raise ValueError("node_token needs a non-empty cluster secret")
    label = f"llmgw node token\0{node}\0{generation}".encode()
    return NODE_TOKEN_PREFIX + hmac.new(cluster_secret, label, hashlib.sha256).hexdigest()


def router_token(cluster_secret: bytes) -> str:
    """The bearer token routers present on the router stream (which carries every engine key)."""
    if not cluster_secret:
        raise ValueError("router_token needs a non-empty cluster secret")
    label = b"llmgw router token\0"
    return ROUTER_TOKEN_PREFIX + hmac.new(cluster_secret, label, hashlib.sha256).hexdigest()


def forbidden_address_reason(url_or_host: str) -> str | None:
    """Why the router must not send requests to this URL or host (link-local or a metadata service); or None.

    Pure: literal addresses (including the numeric forms getaddrinfo accepts, such as `2852039166` or
    `0251.0376.0251.0376` for 169.254.169.254) and well-known metadata names. Names are not resolved here;
    the router checks every resolved address again as it connects (llmgw_router.upstream.egress), so a name that
    resolves to a forbidden address is refused there.
    """
    host = urlsplit(url_or_host).hostname if "//" in url_or_host else url_or_host
    if not host:
        return f"{url_or_host!r} names no host"
    host = host.strip("[]").rstrip(".").lower()
    if host in _METADATA_HOSTS:
        return f"{host} is a cloud metadata service"
    try:
        addr = ipaddress.ip_address(host.split("%")[0])  # fe80::1%eth0 is link-local too
    except ValueError:
        loose = _inet_aton_form(host)
        if loose is None:
            return None
        addr = loose
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # ::ffff:169.254.169.254 reaches the same service
    if addr in _METADATA_ADDRESSES:
        return f"{addr} is a cloud metadata service address"
    if addr.is_link_local:
        return f"{addr} is a link-local address"
    return None


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None when there is no such header or it names
    another scheme. The one parser of the header in llmgw (the agent, which imports nothing of llmgw, has its
    own in its pass-through): every check of a presented token starts here."""
    scheme, _, token = (header or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def is_loopback_host(host: str) -> bool:
    """Whether a host name or address (IPv6 with or without brackets) names this machine only: `localhost`
    or a loopback address. Names other than localhost are not resolved: they count as remote."""
    host = host.strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
