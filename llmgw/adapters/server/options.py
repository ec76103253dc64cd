"""What `llmgw server init` and `llmgw server add` are asked to do (the CLI's flags as records): read by the
steps (init, add) and by the services they start (services), so they live apart from both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmgw.adapters.ssh.bootstrap import Step
from llmgw.adapters.ssh.remote import SshTarget

__all__ = ["AddOptions", "InitOptions"]


@dataclass(frozen=True)
class InitOptions:
    bin_dir: str  # where llmgw, llmgw-router and llmgw-agent are installed
    repo: str | None = None  # a git URL or path to follow; None: a starter repo made from `starter`
    starter: Path | None = None
    store: str | None = None  # an existing store's DSN; None: PostgreSQL on this machine
    ca_from: Path | None = None  # an existing cluster CA directory (ca.key, ca.crt) to take
    addresses: tuple[str, ...] = ()  # names and addresses besides the machine's own, for the certificate
    advertise: str | None = None  # the address agents and routers dial; default: the first non-loopback one
    listen_host: str = "0.0.0.0"
    node: bool = False  # the machine is also a node (an agent beside the control plane)
    name: str = "server"  # the router's name, and the node's with `node`
    service: Literal["auto", "systemd", "process"] = "auto"
    environment: Mapping[str, str] = field(default_factory=dict)
    health_timeout: float = 120.0
    dry_run: bool = False
    on_step: Callable[[Step], None] | None = None


@dataclass(frozen=True)
class AddOptions:
    target: SshTarget  # the other machine, logged in to as root
    bin_dir: str  # where llmgw and llmgw-router are installed on the other machine
    controller: bool = True  # a standby controller there
    router: bool = True  # a router there
    name: str = "server2"  # the other machine's router name
    advertise: str | None = None  # the address the other machine is dialed at (default: the SSH host's)
    addresses: tuple[str, ...] = ()  # names and addresses besides its own, for its certificate
    repo: str | None = (
        None  # the git URL the standby follows (default: the one this machine's controller does)
    )
    service: Literal["auto", "systemd", "process"] = "auto"
    environment: Mapping[str, str] = field(default_factory=dict)
    health_timeout: float = 120.0
    dry_run: bool = False
    on_step: Callable[[Step], None] | None = None
