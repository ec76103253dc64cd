"""Federation (issue 45): another llmgw a Cluster declares as a peer, whose models are offered here as
`PEER/MODEL`; and what a Project says of where its requests may go (`residency`, `no_store`). In their own
module to keep cluster_spec.py and models.py within their size (docs/routing.md, Federation)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, field_validator

from llmgw.core.config.base import Duration, Name, SecretRef, Strict
from llmgw.core.words import parse_duration

__all__ = ["PEER_SEPARATOR", "Peer", "peer_of"]

# A peer's model is offered here as `PEER/MODEL`: the peer's name, this separator, its own name for the model.
PEER_SEPARATOR = "/"


class Peer(Strict):
    """Another llmgw whose models this cluster offers as `NAME/MODEL`, served by that cluster's router."""

    name: Name = Field(description="The peer's name here: its models are offered as NAME/MODEL")
    url: str = Field(
        description="The peer's router (its OpenAI API listener, without /v1), e.g. https://east.example.com"
    )
    key: SecretRef | None = Field(
        None,
        description="An API key of one of the peer's projects (a destination-bound secret: the binding map "
        "must let it go to the url's host for purpose provider-key); requests here are that project's there",
    )
    region: Name | None = Field(
        None, description="Where the peer serves: a project's `residency` lists the regions it may be sent to"
    )
    check_interval: Duration = Field("5s", description="How often the controller asks the peer's /ready")
    timeout: Duration = Field(
        "3s", description="Longest a /ready or /v1/models check may take before the peer counts as down"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or value.rstrip("/").endswith("/v1"):
            raise ValueError(
                f"url must be the peer router's http(s) base without /v1 (got {value!r}; e.g. "
                "https://east.example.com)"
            )
        return value.rstrip("/")

    @field_validator("check_interval", "timeout")
    @classmethod
    def _positive(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"must be longer than zero (got {value!r}; e.g. 5s)")
        return value


def peer_of(name: str, peers: Iterable[str]) -> tuple[str, str] | None:
    """(peer, model) when `name` is `PEER/MODEL` for one of `peers`' names, else None (a name of this cluster's,
    which may itself hold a `/`)."""
    peer, sep, model = name.partition(PEER_SEPARATOR)
    if not sep or not model or peer not in peers:
        return None
    return peer, model
