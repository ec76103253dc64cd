"""Where a request's prefix draws it, given each candidate's match and which are past the load bound. Pure.

Three cases, by the best match any candidate holds (`Candidate.prefix`, a share of the prompt's blocks):

- short (under `prefix.min_share`): nothing worth a queue is cached anywhere, so no candidate scores a prefix
  and load alone decides: with no prefixes in common the policy is least-inflight, and costs nothing.
- some holder (a candidate matching at least `min_share`) is within the load bound: the holders score their
  share, as before; the load term breaks ties among them.
- every holder is past the bound: the prefix is replicated deliberately. The spill replica is the first
  candidate within the bound in the prompt head's rendezvous order (bounded-load consistent hashing, as the
  session scorer places a conversation), and it scores as a holder. So a hot group's overflow lands on the
  same second replica each time, which then holds the group (its events or this router's index say so) and
  serves it from cache, instead of landing on whichever replica is least busy at that moment, prefilling the
  whole prompt there and evicting another group's prefix.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Protocol

__all__ = ["SPILL", "prefix_scores", "spill_key"]

SPILL = "spill"  # the prefix source named for the replica a hot prefix is replicated to


class _Scored(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def prefix(self) -> float: ...


@functools.lru_cache(maxsize=256)
def spill_key(head: str) -> str:
    """A short stable name for a prompt's head (its first message), the same in every router, so the
    rendezvous order over the candidates hashes 16 characters per candidate instead of the whole head."""
    return hashlib.blake2b(head.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _rank(key: str, endpoint: str) -> bytes:
    return hashlib.blake2b(f"{key}\x00{endpoint}".encode(), digest_size=8).digest()


def prefix_scores(
    cands: Sequence[_Scored], over: frozenset[str], key: str, min_share: float
) -> tuple[dict[str, float], str | None]:
    """Each candidate's prefix score, and the spill replica when the prefix was replicated (else None).

    `over` names the candidates past the load bound; `key` names the prompt's head for the rendezvous order."""
    best = max([c.prefix for c in cands], default=0.0)  # a list: no generator resumed per candidate
    if best <= 0.0 or best < min_share:
        return {c.id: 0.0 for c in cands}, None
    holders = [c for c in cands if c.prefix >= min_share]
    if any(c.id not in over for c in holders):
        return {c.id: 0.0 if c.id in over or c.prefix < min_share else c.prefix for c in cands}, None
    free = [c for c in cands if c.id not in over]
    if not free:  # everyone past the bound: nobody is drawn by the prefix, load decides
        return {c.id: 0.0 for c in cands}, None
    target = max(free, key=lambda c: _rank(key, c.id)).id
    return {c.id: best if c.id == target else 0.0 for c in cands}, target
