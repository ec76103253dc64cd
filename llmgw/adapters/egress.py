"""Outgoing connections from any llmgw process: the address actually connected to is checked, so no later DNS
answer can differ from the one checked (the router's providers and scrapes, the controller's webhooks)."""

from __future__ import annotations

import errno
import socket

from aiohappyeyeballs import AddrInfoType

from llmgw.core.errors import LlmgwError
from llmgw.core.security import forbidden_address_reason

__all__ = ["ForbiddenAddress", "checked_socket"]


class ForbiddenAddress(LlmgwError, OSError):
    """A connection would go to a link-local or metadata address; `who` says whose connection it was."""

    def __init__(self, host: str, why: str, who: str = "the router") -> None:
        super().__init__(errno.EACCES, f"{host} is a forbidden address for {who}: {why}")


def checked_socket(addr_info: AddrInfoType, who: str = "the router") -> socket.socket:
    """aiohttp's `socket_factory`: a socket for `addr_info`, refused when its address is forbidden."""
    family, type_, proto, _, sockaddr = addr_info
    address = str(sockaddr[0])
    if why := forbidden_address_reason(address):
        raise ForbiddenAddress(address, why, who)
    return socket.socket(family=family, type=type_, proto=proto)
