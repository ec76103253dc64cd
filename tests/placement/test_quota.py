"""GPU quotas in placement: a profile whose replica would take its owner's Team or Organization past its
quota is skipped (the next profile is tried), explain says which quota, and `quota_room` tells the autoscaler
how much is left."""

from __future__ import annotations

from llmgw.core.placement import explain, place, quota_room, quota_use
from llmgw.core.tenancy.limits import QuotaScope

from .builders import entry, gpu_node, gpu_profile, replica

TEAM = QuotaScope("Team ml", {"h100-80g": 8})
ORG = QuotaScope("Organization acme", {"h100-80g": 12, "a100-80g": 4})


def owned(view, *scopes):
    return view._replace(quotas=scopes)


def test_a_quota_caps_what_a_teams_models_hold_and_the_next_profile_is_tried():
    chat = owned(
        entry(gpu_profile("h100", gpus=4), gpu_profile("a100", gpus=4, gpu_class="a100-80g"), min=4, max=4),
        TEAM,
        ORG,
    )
    nodes = [gpu_node("h1"), gpu_node("h2"), gpu_node("a1", gpu_class="a100-80g")]
    result = place({"chat": chat}, nodes, [])
    profiles = sorted(p.profile for p in result.placements)
    # 8 h100 for the team (two replicas), then a100 up to the organization's 4 (one); the fourth cannot go
    assert profiles == ["a100", "h100", "h100"]
    [missing] = result.unplaced
    assert missing.missing == 1
    summaries = {p.profile: p.summary for p in missing.explanation.profiles}
    assert summaries["h100"] == "quota: Team ml may hold 8 h100-80g, holds 8, a replica needs 4"
    assert summaries["a100"] == "quota: Organization acme may hold 4 a100-80g, holds 4, a replica needs 4"


def test_quota_room_counts_what_replicas_hold_and_other_models_of_the_scope():
    chat = owned(entry(gpu_profile("h100", gpus=4)), TEAM, ORG)
    embed = owned(entry(gpu_profile("h100", gpus=2)), ORG)
    free = entry(gpu_profile("h100", gpus=4))
    models = {"chat": chat, "embed": embed, "free": free}
    replicas = [
        replica("chat-1", "chat", "h100", ("h1", (0, 1, 2, 3))),
        replica("embed-1", "embed", "h100", ("h1", (4, 5)), state="draining"),  # still holds its cards
        replica("free-1", "free", "h100", ("h2", (0, 1, 2, 3))),
    ]
    use = quota_use(models, replicas)
    assert quota_room(chat, "h100-80g", use) == 4  # team: 8 - 4; org: 12 - 6
    assert quota_room(embed, "h100-80g", use) == 6
    assert quota_room(free, "h100-80g", use) is None  # no quota names it: unknown is not zero
    assert quota_room(chat, "b200", use) is None
    why = explain("chat", models, [gpu_node("h3")], replicas).profiles[0].summary
    assert why == "1 of 1 nodes fit"  # within the quota: the usual words
