"""Every connection the router opens is checked at connect time against the forbidden-address rules.

The snapshot's URLs are checked when a snapshot is applied, but only as written: a name, or a numeric form
that getaddrinfo reads as an address (`2852039166` is 169.254.169.254), passes that check. So the check is
made again on the address actually connected to: `checked_socket` is aiohttp's socket factory (providers,
scrapes, the controller link), called with each resolved address just before connecting; `checked_address`
resolves for the lean engine client, which then connects to the literal it checked.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket

import aiohttp
import aiohttp.abc
from aiohappyeyeballs import AddrInfoType

from llmgw.adapters.egress import ForbiddenAddress, checked_socket
from llmgw.core.security import forbidden_address_reason

__all__ = ["ForbiddenAddress", "checked_addresses", "checked_socket", "client_connector"]


def client_connector(resolver: aiohttp.abc.AbstractResolver | None = None) -> aiohttp.TCPConnector:
    """The router's aiohttp connector: every address it connects to passes `checked_socket`. (aiohttp
    itself refuses legacy numeric IPv4 forms in URLs; names are resolved by `resolver`, the default one
    unless a test gives its own.)"""
    return aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, resolver=resolver, socket_factory=checked_socket)


async def checked_addresses(loop: asyncio.AbstractEventLoop, host: str, port: int) -> list[AddrInfoType]:
    """getaddrinfo's answers for `host`, in order, refused when any of them is forbidden (a name with one
    good and one bad address is refused: which one a connection uses is not ours to pick)."""
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        flags = 0
    else:
        flags = socket.AI_NUMERICHOST  # a literal: no lookup
    infos: list[AddrInfoType] = list(await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags))
    if not infos:
        raise OSError(errno.EHOSTUNREACH, f"{host} resolves to no address")
    for info in infos:
        address = str(info[4][0])
        if why := forbidden_address_reason(address):
            raise ForbiddenAddress(f"{host} ({address})" if address != host else host, why)
    return infos
