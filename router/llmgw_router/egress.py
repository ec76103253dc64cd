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

from llmgw.core.errors import LlmgwError
from llmgw.core.security import forbidden_address_reason

__all__ = ["ForbiddenAddress", "checked_addresses", "checked_socket", "client_connector"]


class ForbiddenAddress(LlmgwError, OSError):
    """A connection would go to a link-local or metadata address."""

    def __init__(self, host: str, why: str) -> None:
        super().__init__(errno.EACCES, f"{host} is a forbidden address for the router: {why}")


def checked_socket(addr_info: AddrInfoType) -> socket.socket:
    """aiohttp's `socket_factory`: a socket for `addr_info`, refused when its address is forbidden."""
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    if why := forbidden_address_reason(address):
        raise ForbiddenAddress(address, why)
    return socket.socket(family=family, type=type_, proto=proto)


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
