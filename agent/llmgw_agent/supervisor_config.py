"""What the supervisor is told at start (`SupervisorConfig`): where its state and the weights live, which
addresses and ports engines get, and how long it waits for them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from llmgw_agent import dirfetch, weights

__all__ = ["SupervisorConfig"]


@dataclass
class SupervisorConfig:
    state_dir: Path
    advertise_host: str
    # The serving address routers reach: the pass-through (or, where the engine's own key covers every path and
    # the address is loopback, the engine itself) listens here. None: the advertised address. Listening on all
    # addresses (0.0.0.0, ::) is an explicit choice, never the default.
    bind_host: str | None = None
    port_range: tuple[int, int] = (20000, 20999)
    engine_binaries: dict[str, str] = field(default_factory=dict)
    weights_dir: Path | None = None
    max_download_bytes: int = weights.DEFAULT_MAX_DOWNLOAD_BYTES
    fetch_parallelism: int = dirfetch.DEFAULT_PARALLEL  # files of one directory source fetched at once
    # The Authorization header the agent presents to a weights mirror: its own node token (re-read each time).
    mirror_headers: Callable[[str], dict[str, str]] = dirfetch.no_headers  # url -> headers (mirror_auth)
    ready_timeout_s: float = 600.0
    stop_grace_s: float = 10.0
    poll_interval_s: float = 0.5
    output_poll_s: float = 0.25  # how often new engine output is read into the log ring
    memory_every_s: float = 5.0  # how often each engine's memory is measured
    nvidia_smi: str | None = None  # None: found on PATH (absent: GPU memory unknown)
