"""One rule for "stale" (llmgw.core.fleet.states.is_stale), read by the reconciler, the plan, the canary's split
and the controller's views alike.

The reconciler's rule and the views' disagreed when the repo's side of the fingerprint was empty: the views
called such a replica stale, the reconciler did not. The reconciler's is the right one: an empty fingerprint on
either side is unknown (unknown is not zero), and a replica is never rolled, nor shown as waiting for a roll,
on a guess.
"""

from __future__ import annotations

import pytest

from llmgw.core.fleet.states import (
    ACTIVE_STATES,
    GONE_STATES,
    HELD_STATES,
    REPLICA_STATES,
    is_stale,
)
from llmgw.core.reconcile import replica_stale

from .builders import cpu_profile, entry, fingerprint, replica


@pytest.mark.parametrize(
    ("started_with", "wanted", "stale"),
    [
        ("aaa", "aaa", False),
        ("aaa", "bbb", True),
        ("", "bbb", False),  # an older agent reported none: unknown
        ("aaa", "", False),  # the repo's side unknown: the case the views got wrong
        ("", "", False),
        ("aaa", None, True),  # the profile is gone from the repo
        ("", None, True),  # ... whatever the replica reports
    ],
)
def test_the_one_rule(started_with: str, wanted: str | None, stale: bool) -> None:
    assert is_stale(started_with, wanted) is stale


def test_the_reconciler_reads_the_same_rule_from_its_views() -> None:
    profile = cpu_profile()
    model = entry(profile)
    known = fingerprint(profile)
    assert not replica_stale(replica("r1", "m", "cpu", ("n1", ()), fingerprint=known), model)
    assert replica_stale(replica("r1", "m", "cpu", ("n1", ()), fingerprint="other"), model)
    assert replica_stale(replica("r1", "m", "gone", ("n1", ()), fingerprint=known), model)
    # The repo's fingerprint of the profile unknown (absent from the view): not stale, as the views now say.
    unknown = model._replace(fingerprints={})
    assert not replica_stale(replica("r1", "m", "cpu", ("n1", ()), fingerprint="other"), unknown)


def test_the_replica_state_sets_are_made_of_replica_states() -> None:
    every = set(REPLICA_STATES)
    assert every >= ACTIVE_STATES | GONE_STATES | HELD_STATES
    assert not ACTIVE_STATES & GONE_STATES
    assert ACTIVE_STATES <= HELD_STATES
    # What is neither active nor gone is a failed replica: it still holds its room until it is stopped.
    assert every - ACTIVE_STATES - GONE_STATES == {"failed"}
    assert "stopped" not in HELD_STATES
