"""The pure rules of federation and kept bodies (issue 45): the hop header, a peer's models as published, a
project kept home, which requests' bodies are kept and how they are cut and read back."""

from __future__ import annotations

import json

import pytest
from llmgw_router.decisions.federation import hop_refusal, next_hops, peer_refusal, peer_usable

from llmgw.core.config.models import ProjectSpec
from llmgw.core.config.specs.peer_spec import Peer
from llmgw.core.fleet.federation import PeerCard, PeerView, parse_peer_models, peer_models
from llmgw.core.traffic.kept_bodies import answer_words, cut, sampled


def test_a_request_that_passed_through_this_cluster_is_refused_508_and_others_carry_the_hops_on() -> None:
    assert hop_refusal(None, "east") is None
    assert hop_refusal("west", "east") is None
    refused = hop_refusal("east, west", "east")
    assert refused is not None and refused.status == 508 and refused.code == "peer_loop"
    assert next_hops(None, "east") == "east" and next_hops("west", "east") == "west,east"
    too_long = hop_refusal(",".join(f"c{i}" for i in range(8)), "east")
    assert too_long is not None and "at most 8 hops" in too_long.message


def _peer() -> Peer:
    return Peer(name="west", url="http://127.0.0.1:8081/", region="eu")


def test_a_peers_listing_is_published_as_peer_slash_model_and_a_fallbacks_missing_one_is_withdrawn() -> None:
    card = PeerCard("chat", 4096, ("chat",))
    up = PeerView(up=True, models={"chat": card})
    models = peer_models([_peer()], {"west": up}, {"west": ("west/chat", "west/gone")})
    assert models["west/chat"].provider is not None
    assert models["west/chat"].provider.url == "http://127.0.0.1:8081/v1"
    assert models["west/chat"].peer is not None and models["west/chat"].peer.state == "up"
    gone = models["west/gone"].peer
    assert gone is not None and gone.state == "withdrawn" and "does not offer gone" in (gone.why or "")
    down = peer_models([_peer()], {"west": PeerView(up=False, why="no answer", models={"chat": card})}, {})
    assert down["west/chat"].peer is not None and down["west/chat"].peer.state == "down"
    unchecked = peer_models([_peer()], {}, {"west": ("west/chat",)})
    assert unchecked["west/chat"].peer is not None and unchecked["west/chat"].peer.why == "not checked yet"


def test_a_listing_that_is_not_a_models_page_says_so_and_a_card_without_context_is_left_out() -> None:
    with pytest.raises(ValueError, match="no `data` list"):
        parse_peer_models({"models": []})
    cards = parse_peer_models({"data": [{"id": "a", "context_length": 10}, {"id": "b"}, "junk"]})
    assert list(cards) == ["a"] and cards["a"].capabilities == ("chat", "completions")


def test_no_store_and_residency_keep_a_project_off_a_peer_naming_the_rule() -> None:
    model = peer_models(
        [_peer()], {"west": PeerView(up=True, models={"m": PeerCard("m", 10, ("chat",))})}, {}
    )["west/m"]
    home = ProjectSpec(organization="o", no_store=True)
    refused = peer_refusal("west/m", model, "p", home, fallbacks=True)
    assert refused is not None and refused.status == 403 and "no_store: true" in refused.message
    assert not peer_usable(model, "p", home)
    eu = ProjectSpec(organization="o", residency=["eu"])
    assert peer_refusal("west/m", model, "p", eu, fallbacks=False) is None and peer_usable(model, "p", eu)
    us = ProjectSpec(organization="o", residency=["us"])
    refused = peer_refusal("west/m", model, "p", us, fallbacks=False)
    assert refused is not None and "allows regions us; peer `west` declares region `eu`" in refused.message


def test_the_kept_share_is_the_same_for_a_request_id_everywhere_and_near_the_share_asked() -> None:
    ids = [f"req-{i}" for i in range(2000)]
    kept = [i for i in ids if sampled(i, 0.25)]
    assert kept == [i for i in ids if sampled(i, 0.25)]  # no random source: every router agrees
    assert 400 < len(kept) < 600
    assert all(sampled(i, 1.0) for i in ids[:10])


def test_a_body_is_cut_on_a_character_boundary_and_a_stream_read_back_as_its_text() -> None:
    assert cut("héllo".encode(), 2) == ("h", True)
    assert cut(b"hi", 10) == ("hi", False)
    events = [{"choices": [{"delta": {"content": piece}}]} for piece in ("Hel", "lo")]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    assert answer_words(stream, True) == "Hello"
    whole = json.dumps({"choices": [{"message": {"content": "Hi"}}]})
    assert answer_words(whole, False) == "Hi" and answer_words(None, False) is None
