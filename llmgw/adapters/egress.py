"""Outgoing connections from any llmgw process: the address actually connected to is checked, so no later DNS
answer can differ from the one checked (the router's providers and scrapes, the controller's webhooks and engine
clients), and an answer is read only up to a bound the caller names."""

from __future__ import annotations

import errno
import functools
import socket
from typing import Any

import aiohttp
from aiohappyeyeballs import AddrInfoType

from llmgw.core.errors import LlmgwError
from llmgw.core.security import forbidden_address_reason

__all__ = ["AnswerTooLarge", "ForbiddenAddress", "checked_connector", "checked_socket", "read_at_most"]


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


class AnswerTooLarge(LlmgwError, ValueError):
    """A peer's answer was larger than the reader allows; the message says whose and the bound."""


def checked_connector(who: str, **options: Any) -> aiohttp.TCPConnector:
    """An aiohttp connector whose every connection passes `checked_socket` on the address actually connected
    to (a literal in a URL or a redirect, or a name's answer alike). `who` names the process in refusals."""
    return aiohttp.TCPConnector(socket_factory=functools.partial(checked_socket, who=who), **options)


async def read_at_most(resp: aiohttp.ClientResponse, limit: int, what: str) -> bytes:
    """The body of `resp`, refused with AnswerTooLarge as soon as it passes `limit` bytes: a peer that sends
    an endless body costs `limit` bytes of memory, never more (`what` names it in the message)."""
    body = await resp.content.read(limit + 1)
    while len(body) <= limit and not resp.content.at_eof():
        more = await resp.content.read(limit + 1 - len(body))
        if not more:
            break
        body += more
    if len(body) > limit:
        raise AnswerTooLarge(f"{what} answered with more than {limit} bytes; the rest was not read")
    return body
