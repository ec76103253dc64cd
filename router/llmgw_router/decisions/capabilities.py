"""The capability rule (docs/router.md, Capabilities): a request is forwarded unless the model is known not to
serve what it asks. Pure: the published models and endpoints and the request's body in.

A request needs an endpoint capability (chat, completions, embeddings, rerank, score: its path) and, for a
chat request, the features it uses (`needs_of`: tools offered to call, a json_schema answer, images when a
model of its chain declares vision or lacks it). It is refused, in this order, when:
- the model does not serve the endpoint (not in its effective set: its kind's defaults plus what it declares,
  less `without`), or lacks a feature it uses (`without`): 400 `unsupported_capability`, naming the repo
  change that would lift it (`unsupported`); a fallback that lacks it is left out of the chain;
- every replica of the chain failed the model check of a checked feature (tools, response_format, vision): 400
  `capability_check_failed`, with the check's hint (fix the engine, then `llmgw model check` again);
- the model is `verified_only` and no replica passed that check: 400 `capability_unverified` (run the
  check), or 503 with Retry-After while the check that decides runs.
Otherwise it is forwarded, to a replica whose check did not fail it (and, `verified_only`, passed it) when
there is one: an unchecked replica is not known to fail, so it serves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from llmgw.core.config.models import ENDPOINT_CAPABILITIES
from llmgw.core.snapshot import Endpoint, PublishedModel

__all__ = [
    "CHECKED",
    "CHECKING_RETRY_AFTER_S",
    "Refusal",
    "lacked",
    "needs_of",
    "refusal",
    "unsupported",
    "usable",
    "vision_matters",
]

# A check in progress ends in seconds (a few short requests to one replica): the client may ask again then.
CHECKING_RETRY_AFTER_S = 5

# The needs a model check verifies (a probe of the same name); the others are decided by the repo alone.
CHECKED = frozenset({"tools", "response_format", "vision"})

_DOCS = "docs/router.md, Capabilities"


def needs_of(body: Mapping[str, Any], *, vision: bool = False) -> frozenset[str]:
    """The features a chat request uses: `tools` when it offers tools it lets the model call (a tool_choice
    of "none" does not), `response_format` when it asks for a json_schema answer, and with `vision` (asked
    only when a model of the chain declares or lacks it: the messages are not walked otherwise) `vision` when
    a message carries an image. Stream usage is not a need: the router asks every stream for it (its own accounting)."""
    out = set()
    tools = body.get("tools")
    if isinstance(tools, list) and tools and body.get("tool_choice") != "none":
        out.add("tools")
    response_format = body.get("response_format")
    # Not None first: isinstance against an abc costs a cache lookup, and most requests name no format.
    if (
        response_format is not None
        and isinstance(response_format, Mapping)
        and response_format.get("type") == "json_schema"
    ):
        out.add("response_format")
    if vision and _has_image(body.get("messages")):
        out.add("vision")
    return frozenset(out)


def _has_image(messages: Any) -> bool:
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(part, Mapping) and part.get("type") == "image_url" for part in content
        ):
            return True
    return False


def lacked(model: PublishedModel, kind: str, needs: Collection[str]) -> str | None:
    """The first thing the request needs that `model` is known not to serve: the endpoint `kind` outside
    its effective set, or a need it says it lacks; None: it may serve the request."""
    if kind in ENDPOINT_CAPABILITIES and kind not in model.capabilities:
        return kind
    return next((c for c in model.without if c in needs), None)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the request is not forwarded: status, OpenAI code and param, a message that names the step that
    lifts it. `checking`: a model check that decides is running (503: asking again soon may succeed)."""

    message: str
    code: str
    param: str
    checking: bool = False

    @property
    def status(self) -> int:
        return 503 if self.checking else 400


def unsupported(name: str, model: PublishedModel, capability: str) -> Refusal:
    """The refusal for a capability `lacked` found: what the repo says, and the change that would lift it."""
    served = ", ".join(model.capabilities) or "nothing"
    if capability in model.without:
        why = f"the cluster repo says it lacks `{capability}` (`without: [{capability}]`)"
        lift = f"if it does serve it, remove `{capability}` from the model's `without`"
    else:
        why = f"it serves {served}"
        lift = f"if it does serve it, add `{capability}` to the model's `capabilities`"
    return Refusal(
        f"Model `{name}` does not serve `{capability}`: {why}. Ask a model that serves it; {lift} ({_DOCS}).",
        "unsupported_capability",
        "model" if capability in ENDPOINT_CAPABILITIES else _param(capability),
    )


def usable(ep: Endpoint, needs: Collection[str], verified_only: bool) -> bool:
    """The endpoint may serve a request with these needs: its check failed none of them (and, for a
    `verified_only` model, passed each)."""
    checked = [n for n in needs if n in CHECKED]
    if verified_only:
        return all(n in ep.verified for n in checked)
    return not any(n in ep.failed for n in checked)


def refusal(
    endpoints: Mapping[str, Sequence[Endpoint]],
    models: Mapping[str, PublishedModel],
    chain: Sequence[str],
    needs: frozenset[str],
) -> Refusal | None:
    """The refusal of a request no endpoint of its chain (the model, then its fallbacks) may serve for what
    the model checks said; None when some endpoint may (or the chain has none at all: that is the
    scheduler's 503)."""
    checked = needs & CHECKED
    strict = {m for m in chain if m in models and models[m].verified_only}
    eps = [ep for m in chain for ep in endpoints.get(m, ())]
    if not checked or not eps or any(usable(ep, checked, ep.model in strict) for ep in eps):
        return None
    # The need no endpoint serves; each may have one while none serves them all: then the first.
    lone = [n for n in sorted(checked) if not any(usable(ep, (n,), ep.model in strict) for ep in eps)]
    probe = lone[0] if lone else sorted(checked)[0]
    names = ", ".join(f"`{m}`" for m in chain)
    param = _param(probe)
    undecided = [ep for ep in eps if probe not in ep.failed and probe not in ep.verified]
    if any(ep.checking for ep in undecided):
        message = (
            f"No replica of {names} is verified for `{probe}` yet: its model check is in progress; ask again "
            f"in a few seconds ({_DOCS})."
        )
        return Refusal(message, "capability_unverified", param, checking=True)
    if not undecided:
        hints = sorted({ep.failed_details.get(probe, "") for ep in eps} - {""})
        said = f": {hints[0]}" if hints else ""
        message = (
            f"No replica of {names} serves `{probe}`: the model check of its engine failed it{said}. Fix that, "
            f"then `llmgw model check {chain[0]}` records the new verdict and such requests are forwarded again"
        )
        if probe == "tools":
            message += (
                "; if the model cannot call tools, add `tools` to its `without` to refuse them up front"
            )
        return Refusal(f"{message} ({_DOCS}).", "capability_check_failed", param)
    strict_model = next((ep.model for ep in undecided if ep.model in strict), chain[0])
    message = (
        f"`{strict_model}` is `verified_only`: a request needing `{probe}` goes only to a replica whose model "
        f"check passed it, and no replica of {names} was checked for it. Run `llmgw model check "
        f"{strict_model}` (or turn the controller's model_checks_auto on), or set `verified_only: false` on the "
        f"model ({_DOCS})."
    )
    return Refusal(message, "capability_unverified", param)


def _param(need: str) -> str:
    return {"tools": "tools", "response_format": "response_format", "vision": "messages"}.get(need, "model")


def vision_matters(models: Mapping[str, PublishedModel], canonical: str) -> bool:
    """A model of the request's published chain says it lacks vision, or declares it (its model check may
    have failed it): only then are its messages searched for images (most requests are not)."""
    model = models[canonical]
    return any(
        "vision" in m.without or "vision" in m.capabilities
        for m in (model, *(models.get(fb) for fb in model.fallbacks))
        if m is not None
    )
