"""The agent's configuration: a small JSON file, flags over it. Parsed once, at the edge."""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from llmgw_agent.logring import DEFAULT_MAX_BYTES, DEFAULT_MAX_LINES
from llmgw_agent.weights import DEFAULT_MAX_DOWNLOAD_BYTES


class EngineConf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str | None = None  # executable (for sglang: the python that has sglang installed)
    version: str | None = None


class TlsConf(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cert: str
    key: str
    ca: str


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    node: str = Field(default_factory=socket.gethostname)
    controllers: list[str] = Field(min_length=1)
    token_file: str | None = None
    tls: TlsConf | None = None
    state_dir: str
    model_dirs: list[str] = Field(default_factory=list)
    weights_dir: str | None = None
    # A weights download whose Model declares no size_bytes stops here: a disk must not fill up on a URL.
    max_download_bytes: int = Field(default=DEFAULT_MAX_DOWNLOAD_BYTES, ge=1)
    # Files of one directory source fetched at once.
    fetch_parallelism: int = Field(default=4, ge=1, le=64)
    advertise_host: str = "127.0.0.1"
    # Where routers' connections are accepted (the pass-through in front of each engine); engines themselves
    # listen on 127.0.0.1. None: advertise_host. 0.0.0.0 or :: (every address) only when set explicitly.
    bind_host: str | None = None
    port_range: tuple[int, int] = (20000, 20999)
    inventory_override: str | None = None
    engines: dict[str, EngineConf] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    max_backoff_s: float = 30.0
    # host:port of the node-health metrics listener for Prometheus (llmgw_agent_exporter); None: none opened.
    metrics_listen: str | None = None
    # The weights filesystem's free space below which `llmgw doctor NODE` fails (warns below twice this).
    doctor_min_free_bytes: int = Field(default=5 * 2**30, ge=0)
    # The log ring (engine output and the agent's own lines, served by `llmgw logs`): whichever bound is hit
    # first drops the oldest lines.
    log_ring_lines: int = Field(default=DEFAULT_MAX_LINES, ge=100, le=1_000_000)
    log_ring_bytes: int = Field(default=DEFAULT_MAX_BYTES, ge=64 * 1024, le=1024**3)

    @model_validator(mode="after")
    def _check(self) -> AgentConfig:
        lo, hi = self.port_range
        if not (0 < lo <= hi < 65536):
            raise ValueError(f"port_range {lo}-{hi}: want two ports, low first, within 1-65535")
        if self.metrics_listen is not None:
            _, sep, port = self.metrics_listen.rpartition(":")
            if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
                raise ValueError(f"metrics_listen {self.metrics_listen!r}: want HOST:PORT, e.g. 0.0.0.0:9092")
        return self

    def controller_urls(self) -> list[str]:
        """`host:port` becomes ws(s)://host:port/agent/v1 (wss when TLS files are configured)."""
        scheme = "wss" if self.tls else "ws"
        urls = []
        for addr in self.controllers:
            if "://" in addr:
                base = addr.replace("https://", "wss://").replace("http://", "ws://").rstrip("/")
                urls.append(base if base.endswith("/agent/v1") else base + "/agent/v1")
            else:
                urls.append(f"{scheme}://{addr}/agent/v1")
        return urls


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="JSON configuration file (flags override it)")
    p.add_argument("--node", help="node name (default: hostname)")
    p.add_argument("--controller", action="append", help="controller address host:port (repeat for standbys)")
    p.add_argument("--token-file", help="file holding the bearer token")
    p.add_argument("--tls-cert", help="client certificate (mutual TLS)")
    p.add_argument("--tls-key", help="client key (mutual TLS)")
    p.add_argument("--tls-ca", help="CA that signed the controller's certificate")
    p.add_argument("--state-dir")
    p.add_argument("--model-dir", action="append", help="directory holding models (repeatable)")
    p.add_argument("--weights-dir", help="cache for fetched weights (default: STATE_DIR/weights)")
    p.add_argument("--fetch-parallelism", type=int, help="files of a directory source fetched at once (4)")
    p.add_argument("--advertise-host", help="address routers use to reach this node's engines")
    p.add_argument(
        "--bind-host",
        help="serving address routers connect to (default: the advertised address; 0.0.0.0 only if you mean it)",
    )
    p.add_argument("--port-range", help="engine ports, LO-HI")
    p.add_argument("--inventory-override", help="JSON file replacing measured inventory fields")
    p.add_argument(
        "--engine", action="append", help="NAME=PATH[@VERSION], e.g. llamacpp=/usr/bin/llama-server@b11434"
    )
    p.add_argument("--label", action="append", help="KEY=VALUE (repeatable)")
    p.add_argument("--metrics-listen", help="HOST:PORT of the node-health metrics listener (default: none)")
    p.add_argument("--log-level", default="INFO")


def load(ns: argparse.Namespace) -> AgentConfig:
    """Merge the config file and flags; raise SystemExit with a message naming the bad field."""
    data: dict[str, object] = {}
    if ns.config:
        try:
            data = json.loads(Path(ns.config).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise SystemExit(f"llmgw-agent: cannot read config {ns.config}: {exc}") from exc
    simple = {
        "node": ns.node,
        "token_file": ns.token_file,
        "state_dir": ns.state_dir,
        "weights_dir": ns.weights_dir,
        "advertise_host": ns.advertise_host,
        "bind_host": ns.bind_host,
        "inventory_override": ns.inventory_override,
        "fetch_parallelism": ns.fetch_parallelism,
        "metrics_listen": ns.metrics_listen,
    }
    data.update({k: v for k, v in simple.items() if v is not None})
    if ns.controller:
        data["controllers"] = ns.controller
    if ns.model_dir:
        data["model_dirs"] = ns.model_dir
    if ns.port_range:
        lo, _, hi = ns.port_range.partition("-")
        data["port_range"] = (int(lo), int(hi or lo))
    if ns.tls_cert or ns.tls_key or ns.tls_ca:
        data["tls"] = {"cert": ns.tls_cert, "key": ns.tls_key, "ca": ns.tls_ca}
    engines = dict(data.get("engines") or {})  # type: ignore[call-overload]
    for item in ns.engine or []:
        name, _, rest = item.partition("=")
        path, _, version = rest.partition("@")
        engines[name] = {"path": path or None, "version": version or None}
    data["engines"] = engines
    labels = dict(data.get("labels") or {})  # type: ignore[call-overload]
    for item in ns.label or []:
        key, _, value = item.partition("=")
        labels[key] = value
    data["labels"] = labels
    try:
        return AgentConfig.model_validate(data)
    except ValidationError as exc:
        raise SystemExit(f"llmgw-agent: invalid configuration:\n{exc}") from exc
