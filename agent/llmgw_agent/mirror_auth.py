"""Where the agent's hub token may go besides the hub: the controller's own machine, nowhere else (M14). Pure.

The token in `token_file` (the node's own, or for a hand-installed agent the Cluster's shared token) opens the
agent hub and the controller's weights mirror. The mirror's address is `Cluster.spec.mirror.url`, which any
repo editor writes: sending the token to whatever it names would hand every node's credential to a collector
of the editor's choice. So the token rides on a mirror request only when the mirror's host is the host of one
of the controllers this agent dials (where `llmgw controller --mirror-dir` serves). Any other mirror is asked
without a credential: a public HF-layout server still works; a private one must be the controller's.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["hub_token_may_go"]


def _host(url: str) -> str | None:
    try:
        return (urlsplit(url).hostname or "").lower() or None
    except ValueError:
        return None


def hub_token_may_go(url: str, controller_urls: Iterable[str]) -> bool:
    """Whether a request to `url` (a mirror file) may carry the hub token: its host is a controller's."""
    if urlsplit(url).scheme not in ("http", "https"):
        return False
    host = _host(url)
    return host is not None and host in {_host(c) for c in controller_urls}
