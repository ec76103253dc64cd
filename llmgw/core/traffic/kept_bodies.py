"""Request and answer bodies kept (docs/tenancy.md, Bodies kept and replayed), pure: what one kept request holds
and its form in the content vault (`llmgw.store.queries.content`, kind `body`, the one retention mechanism
Responses turns use too), written by the router and read by the controller for `llmgw request ID --body` and
`--replay MODEL`.

A project keeps bodies when its `retention.bodies` says so (and `retention.content`, whose TTL they live by):
a `share` of its requests, each body cut at `max_bytes` (and said to be cut), redacted by its guardrails' PII
rules unless `redact: false`. Which requests: a hash of the request id under the share, so every router of the
cluster keeps the same ones and no random source is read on the request path.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

from llmgw.core.config.models import ContentRetention
from llmgw.core.config.specs.tenant.retention_spec import BodyRetention
from llmgw.core.traffic.recorded import content_ttl

__all__ = [
    "KIND",
    "KeptBody",
    "answer_words",
    "body_retention",
    "cut",
    "read_kept",
    "request_json",
    "sampled",
]

KIND = "body"  # the vault's kind for a kept request's bodies


@dataclass(frozen=True)
class KeptBody:
    """One request's bodies as kept: the request as the client sent it (redacted), the answer as it went back
    (whole JSON, or the stream's events as text), and what served it."""

    request_id: str
    project: str
    model: str  # asked for
    served: str | None  # the model that answered (a fallback's name when one did); None: none did
    status: int
    stream: bool
    request: str
    answer: str | None  # None: no answer body (refused before one was made)
    request_cut: bool = False
    answer_cut: bool = False
    redacted: bool = False
    time: float = 0.0  # when it finished (wall clock)

    def data(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()


def read_kept(data: bytes) -> KeptBody:
    """A kept record back; ValueError when it is not one (a newer router's form, or not ours)."""
    try:
        raw = json.loads(data)
        return KeptBody(**raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a kept request body record ({exc})") from None


def body_retention(retention: ContentRetention | None) -> tuple[BodyRetention, float] | None:
    """The project's body retention and the TTL its bodies live for; None when it keeps none."""
    ttl = content_ttl(retention)
    if retention is None or retention.bodies is None or ttl is None:
        return None
    return retention.bodies, ttl


def sampled(request_id: str, share: float) -> bool:
    """Is this request in the kept `share`? The same answer on every router (a hash of its id)."""
    if share >= 1:
        return True
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < share


def cut(data: bytes, max_bytes: int) -> tuple[str, bool]:
    """`data` as text, at most `max_bytes` of it (cut on a character boundary); and whether it was cut."""
    if len(data) <= max_bytes:
        return data.decode("utf-8", "replace"), False
    return data[:max_bytes].decode("utf-8", "ignore"), True


def request_json(kept: KeptBody) -> dict[str, Any]:
    """The kept request as JSON, for a replay; ValueError when it was cut or is not a JSON object."""
    if kept.request_cut:
        raise ValueError(
            f"request {kept.request_id}'s body was kept cut at the project's max_bytes: it cannot be replayed"
        )
    body = json.loads(kept.request)
    if not isinstance(body, dict):
        raise ValueError(f"request {kept.request_id}'s kept body is not a JSON object")
    return body


def answer_words(answer: str | None, stream: bool) -> str | None:
    """The text of a kept answer as a reader wants it: a whole answer's first choice, or a stream's deltas put
    back together; None when it holds none (an error, or cut before any text)."""
    if answer is None:
        return None
    if not stream:
        try:
            return _choice_text(json.loads(answer), "message")
        except ValueError:
            return None
    parts: list[str] = []
    for line in answer.splitlines():
        data = line.removeprefix("data:").strip() if line.startswith("data:") else None
        if not data or data == "[DONE]":
            continue
        try:
            piece = _choice_text(json.loads(data), "delta")
        except ValueError:
            continue  # the last event, cut at max_bytes
        if piece:
            parts.append(piece)
    return "".join(parts) if parts else None


def _choice_text(obj: Any, part: str) -> str | None:
    choices = obj.get("choices") if isinstance(obj, dict) else None
    first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    if first is None:
        return None
    inner = first.get(part)
    text = inner.get("content") if isinstance(inner, dict) else first.get("text")
    return text if isinstance(text, str) else None
