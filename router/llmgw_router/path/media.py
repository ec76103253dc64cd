"""Tenants' media URLs, checked before any engine sees them (security review M13).

vLLM and SGLang fetch the URL of an `image_url`, `video_url` or `audio_url` content part themselves, from
the GPU node, inside the node network. A URL a tenant names would make the node issue that GET: the
metadata service, the controller, another engine. So a media part may carry a `data:` URL (the media
inline, what OpenAI's and Anthropic's clients send for local files), or an http(s) URL whose host the Cluster
allows (`spec.router.media_hosts`, exact names or `*.domain`), and that host must resolve, here, to public
addresses only: the router's egress check (no metadata service, no link-local address; egress.py) plus the
private and loopback ranges. Anything else is a 400 naming the part.

Responses' `input_image` and Anthropic's `source: {type: url}` arrive here as the chat `image_url` parts
they are translated to; every part type ending in `_url` is read, so a media kind an engine adds later is
refused unless it is inline.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from llmgw.core.security import forbidden_address_reason
from llmgw_router.server.errors import ApiError
from llmgw_router.upstream.egress import ForbiddenAddress, checked_addresses

__all__ = ["check_media", "host_allowed", "media_urls"]


def media_urls(body: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each media part's URL (as sent: maybe not a string) with where it is, `messages[0].content[1]...`."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if not isinstance(kind, str) or not kind.endswith("_url"):
                continue
            value = part.get(kind)
            at = f"messages[{i}].content[{j}].{kind}"
            yield (f"{at}.url", value.get("url")) if isinstance(value, dict) else (at, value)


def host_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Whether `host` is one of `allowed`: an exact name, or beneath a `*.domain` entry."""
    host = host.rstrip(".").lower()
    return any(host == a or (a.startswith("*.") and host.endswith(a[1:])) for a in allowed)


def _address_refusal(address: str) -> str | None:
    """Why a media host's address is not one a node may be sent to, or None."""
    why = forbidden_address_reason(address)
    if why is not None:
        return why
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return None if ip.is_global else f"{ip} is not a public address"


async def check_media(body: dict[str, Any], allowed: Sequence[str]) -> None:
    """Raise the 400 for the first media URL the engine must not be sent (see the module's words)."""
    for at, url in media_urls(body):
        why = await _refusal(url, allowed)
        if why is not None:
            hint = "send the media inline as a data: URL (data:image/png;base64,...)" + (
                f", or use a host in the Cluster's spec.router.media_hosts ({', '.join(allowed)})"
                if allowed
                else ""
            )
            raise ApiError(400, f"`{at}`: {why}; {hint}.", "media_url_refused", param=at)


async def _refusal(url: Any, allowed: Sequence[str]) -> str | None:
    if not isinstance(url, str):
        return "a media URL must be a string"
    if url[:5].lower() == "data:":
        return None
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme.lower() not in ("http", "https") or not host:
        return f"a media URL must be data:, or http(s) to an allowed host (not {parts.scheme or 'no'} scheme)"
    if not host_allowed(host, allowed):
        return f"the host `{host}` is not one the Cluster allows media from"
    try:
        infos = await checked_addresses(
            asyncio.get_running_loop(), host, port or (443 if parts.scheme == "https" else 80)
        )
    except ForbiddenAddress as e:
        return str(e)
    except OSError as e:
        return f"the host `{host}` does not resolve ({e.strerror or e})"
    for info in infos:
        why = _address_refusal(str(info[4][0]))
        if why is not None:
            return f"the host `{host}` resolves to a refused address: {why}"
    return None
