"""The adapter-affinity rule (llmgw_router.decisions.adapter_affinity.choose), over every shape of fleet hypothesis
makes: a replica holding the adapter with room is always preferred, a load goes to exactly one replica with
room, and a request is never left with nowhere to go."""

from __future__ import annotations

from hypothesis import given, strategies as st
from llmgw_router.decisions.adapter_affinity import AdapterReplica, choose

candidates = st.lists(
    st.builds(
        AdapterReplica,
        id=st.text("abcdef", min_size=1, max_size=3),
        holds=st.booleans(),
        loadable=st.booleans(),
        load=st.floats(0, 2, allow_nan=False),
        saturated=st.booleans(),
    ),
    min_size=1,
    max_size=8,
    unique_by=lambda c: c.id,
)


@given(candidates)
def test_a_holder_with_room_is_always_preferred(fleet: list[AdapterReplica]) -> None:
    choice = choose(fleet)
    ready = {c.id for c in fleet if c.holds and not c.saturated}
    if ready:
        assert choice.allowed == ready and choice.load_on is None


@given(candidates)
def test_a_load_goes_to_one_unsaturated_replica_that_can_load_and_is_least_loaded(
    fleet: list[AdapterReplica],
) -> None:
    choice = choose(fleet)
    if choice.load_on is None:
        return
    target = next(c for c in fleet if c.id == choice.load_on)
    assert choice.allowed == {target.id}
    assert target.loadable and not target.holds and not target.saturated
    assert not any(c.holds and not c.saturated for c in fleet), "no load while a holder has room"
    rivals = [c for c in fleet if c.loadable and not c.holds and not c.saturated]
    assert (target.load, target.id) == min((c.load, c.id) for c in rivals)


@given(candidates)
def test_a_request_always_has_somewhere_to_go_among_the_candidates(fleet: list[AdapterReplica]) -> None:
    choice = choose(fleet)
    assert choice.allowed and choice.allowed <= {c.id for c in fleet}
    holders = {c.id for c in fleet if c.holds}
    if choice.load_on is None and holders:
        assert choice.allowed <= holders, "without a load, only holders serve when there are any"


@given(candidates, st.randoms())
def test_the_choice_does_not_depend_on_the_order_replicas_are_listed(
    fleet: list[AdapterReplica], rng
) -> None:  # type: ignore[no-untyped-def]
    shuffled = list(fleet)
    rng.shuffle(shuffled)
    assert choose(shuffled) == choose(fleet)


def test_two_holders_one_saturated_leave_the_other() -> None:
    fleet = [
        AdapterReplica("a", holds=True, loadable=True, load=1.0, saturated=True),
        AdapterReplica("b", holds=True, loadable=True, load=0.5, saturated=False),
        AdapterReplica("c", holds=False, loadable=True, load=0.0, saturated=False),
    ]
    assert choose(fleet).allowed == {"b"}
    fleet[1] = AdapterReplica("b", holds=True, loadable=True, load=1.0, saturated=True)
    choice = choose(fleet)
    assert (choice.allowed, choice.load_on) == ({"c"}, "c")  # both holders full: load it on the idle one
