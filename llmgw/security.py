"""Small security primitives shared by the controller, the agent's launcher and the router.

Engine keys are derived, not stored: the router must send the right key to replicas it never saw start
(adopted after a controller restart, placed by another controller), and an HMAC of the replica id under the
cluster secret gives that without a table to keep in step. A key taken from one node opens that replica only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from urllib.parse import urlsplit

__all__ = ["ENGINE_KEY_PREFIX", "engine_key", "forbidden_address_reason"]

ENGINE_KEY_PREFIX = "llmgw-ek-"

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


def engine_key(cluster_secret: bytes, replica_id: str) -> str:
    """The key replica `replica_id`'s engine demands: HMAC-SHA256 of the id under the secret, hex, prefixed."""
    if not cluster_secret:
        raise ValueError("engine_key needs a non-empty cluster secret")
    digest = hmac.new(cluster_secret, replica_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return ENGINE_KEY_PREFIX + digest


def forbidden_address_reason(url_or_host: str) -> str | None:
    """Why the router must not send requests to this URL or host (link-local or a metadata service); or None.

    Only literal addresses and well-known metadata names are checked: resolving names here would make a
    pure check do I/O, and a name resolving to a link-local address is caught by the operator's egress rules.
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
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped  # ::ffff:169.254.169.254 reaches the same service
    if addr in _METADATA_ADDRESSES:
        return f"{addr} is a cloud metadata service address"
    if addr.is_link_local:
        return f"{addr} is a link-local address"
    return None
