"""The router's API listener settings (`spec.router.listener`): how long a client may take to send a request,
how many connections may wait unauthenticated, and whose forwarded address counts as the client's.

Apart from llmgw.core.config.models so that file stays under its size; models re-exports the name.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator

from llmgw.core.config.base import Duration, Strict

__all__ = ["ListenerSettings"]


class ListenerSettings(Strict):
    """Bounds on what an unauthenticated client can hold on the router's API listener (docs/router.md)."""

    body_timeout: Duration = Field(
        "30s",
        description="Longest a request's body may take to arrive after its head, plus one second per 16 KiB "
        "received (a slow upload that keeps a 16 KiB/s pace is not cut); past it the request is answered 408 "
        "and its connection closed",
    )
    max_unauthenticated: int = Field(
        4096,
        ge=1,
        description="Connections open at once that no request with a valid key has come on yet, from every "
        "client together (at most half the descriptor limit); at the cap the oldest is closed to admit a new one",
    )
    max_unauthenticated_per_peer: int = Field(
        256,
        ge=1,
        description="The same, per client address; a connection that carried one authenticated request no "
        "longer counts. Keep it above the connections any one address opens at once (a benchmark at c=64), or "
        "list that address in trusted_proxies",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Addresses or CIDR networks of load balancers and proxies in front of the router: a "
        "connection from one is never capped by its own address; the client it names in X-Forwarded-For (else "
        "Forwarded: for=) is counted instead",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                ipaddress.ip_network(value, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies: {value!r} is not an IP address or a CIDR network (e.g. 10.0.0.5 or "
                    "10.0.0.0/8)"
                ) from None
        return values
