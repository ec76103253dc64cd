"""The Node kind's spec: how the controller reaches a machine (SSH), where replicas may go on it, and what
bootstrap writes into its agent's configuration."""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from llmgw.core.config.base import (
    SecretRef,
    Strict,
)


class SshSettings(Strict):
    """How the controller logs in to bootstrap and manage the node."""

    user: str = Field("llmgw", description="SSH user the controller logs in as")
    port: int = Field(22, ge=1, le=65535, description="SSH port")
    identity: SecretRef | None = Field(None, description="Private key file the controller uses")
    host_key: str | None = Field(None, description="Pinned host public key (`ssh-ed25519 AAAA...`)")
    known_hosts: str | None = Field(None, description="known_hosts file checked when no key is pinned")


class NodeAgentSettings(Strict):
    """What bootstrap writes into the node agent's own configuration."""

    metrics_listen: str | None = Field(
        None,
        pattern=r"^[^\s/]+:[0-9]{1,5}$",
        description="host:port of the agent's node-health listener for Prometheus (e.g. `0.0.0.0:9092`); "
        "the controller's http_sd lists it. Unset: the agent opens none",
    )


class NodeSpec(Strict):
    """How the controller reaches the machine, and where replicas may go on it."""

    model_config = ConfigDict(
        json_schema_extra={
            "if": {"not": {"properties": {"local": {"const": True}}, "required": ["local"]}},
            "then": {"required": ["address"]},
        }
    )

    local: bool = Field(False, description="The machine `llmgw up` runs on; needs no SSH")
    address: str | None = Field(None, description="Host name or IP address (required unless local)")
    ssh: SshSettings | None = Field(None, description="SSH settings (remote nodes)")
    fabric: str | None = Field(None, description="Nodes sharing a fabric have a fast interconnect")
    fabric_address: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\s/:]+$",
        description="This node's address on its fabric: where a multi-node replica's distributed sockets (Ray, "
        "NCCL's bootstrap) bind and meet (default: `address`; 127.0.0.1 for `local`)",
    )
    serving_address: str | None = Field(
        None,
        min_length=1,
        pattern=r"^[^\s/]+$",
        description="Address routers reach this node's engines at; the agent's key-checking pass-through "
        "listens there and engines themselves only on 127.0.0.1 (default: `address`; 127.0.0.1 for `local`)",
    )
    serving_listen_all: bool = Field(
        False,
        description="Listen on every address (0.0.0.0) instead of `serving_address`, e.g. behind NAT; "
        "validate and plan warn about it",
    )
    cordoned: bool = Field(False, description="No new replicas are placed here; running ones stay")
    power_watts: float | None = Field(
        None,
        gt=0,
        description="What the node draws with its GPUs idle (host, fans, idle cards), counted against its "
        "facility domains' power caps; busy GPUs add their class's `watts` (unset: not known)",
    )
    airgapped: bool = Field(
        False, description="Fetches weights from the Cluster's mirror only, never from an origin"
    )
    agent: NodeAgentSettings = Field(
        default_factory=NodeAgentSettings, description="The node agent's settings bootstrap writes"
    )

    @model_validator(mode="after")
    def _address_unless_local(self) -> NodeSpec:
        if not self.local and not self.address:
            raise ValueError("a node needs `address` unless it is `local: true`")
        return self
