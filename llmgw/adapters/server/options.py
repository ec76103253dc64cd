"""What `llmgw server init` is asked to do (the CLI's flags as a record): read by the steps (init) and by the
services they start (services), so it lives apart from both."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from llmgw.adapters.ssh.bootstrap import Step

__all__ = ["InitOptions"]


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
