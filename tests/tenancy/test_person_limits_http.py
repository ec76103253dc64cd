"""Limits for people through two router processes on one PostgreSQL store (issue 44): a person's own rpm holds
across every key and project they spend through, and a project's `per_member` rpm gives each member a pool of
their own; both pooled as the tenants' limits are, so two routers together let through no more than the limit
(margin 0 for rpm, docs/tenancy.md) and no fewer than the limit less one share per router. Then `llmgw usage
--by person` counts what each person sent."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from .helpers import cli, in_one_window, outcome, start_router, window_start_offset

pytestmark = [pytest.mark.integration, pytest.mark.postgres]

OWN_RPM, SHARE_RPM = 6, 4


def with_people(snap: dict[str, Any]) -> dict[str, Any]:
    """The tenancy snapshot with people: `pat` (6 requests a minute of their own) in two projects, and two
    members of a project that gives each member 4 a minute."""
    tenants = snap["tenants"]
    tenants["projects"] |= {
        "pat-a": {"team": "research"},
        "pat-b": {"team": "research"},
        "shares": {"team": "research", "per_member": {"rpm": SHARE_RPM}},
    }
    tenants["people"] = {
        "pat": {
            "email": "pat@example.com",
            "limits": {"rpm": OWN_RPM},
            "memberships": [{"project": "pat-a"}, {"project": "pat-b"}],
        },
        "mia": {"email": "mia@example.com", "memberships": [{"project": "shares"}]},
        "max": {"email": "max@example.com", "memberships": [{"project": "shares"}]},
    }
    return snap


def personal_key(dsn: str, owner: str, project: str) -> str:
    made = json.loads(cli("keys", "create", "--owner", owner, "--project", project, "--store", dsn, "--json"))
    assert made["owner"] == owner and made["project"] == project, made
    return str(made["key"])


def test_person_and_member_limits_hold_across_two_routers(
    pg_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    keys = {
        "pat": [personal_key(pg_dsn, "pat", "pat-a"), personal_key(pg_dsn, "pat", "pat-b")],
        "mia": [personal_key(pg_dsn, "mia", "shares")],
        "max": [personal_key(pg_dsn, "max", "shares")],
    }
    offset = window_start_offset()  # one offset for both: they share the store's windows
    snapshot = with_people(snap)
    routers = [
        start_router(tmp_path, snapshot, pg_dsn, name=f"router-{i}", clock_offset=offset) for i in (1, 2)
    ]
    # (person, router, client): each person's keys spread over both routers.
    clients = [(p, i % 2, routers[i % 2].client(k)) for p, ks in keys.items() for i, k in enumerate(ks * 2)]
    sent = 16  # per client: far above any limit here

    def burst() -> list[tuple[str, int, str]]:
        # One request of each person through each router first, so both are known to serve them (pat's two
        # keys through both); then all the rest at once.
        first = {(p, r): c for p, r, c in reversed(clients)}
        out = [(p, r, outcome(c)) for (p, r), c in first.items()]
        with ThreadPoolExecutor(8) as pool:
            jobs = [(p, r, c) for p, r, c in clients for _ in range(sent)][len(out) :]
            out += pool.map(lambda job: (job[0], job[1], outcome(job[2])), jobs)
        return out

    try:
        outcomes = in_one_window(offset, burst)
    finally:
        for _p, _r, c in clients:
            c.close()
        for r in routers:
            assert r.stop() == 0, r.text()[-3000:]
    served = {p: sum(1 for q, _r, o in outcomes if q == p and o == "ok") for p in keys}
    # margin 0; under-use at most one share (10% of the limit, at least 1) per router
    assert OWN_RPM - 2 <= served["pat"] <= OWN_RPM, served
    for member in ("mia", "max"):  # each their own pool of 4, whatever the other spent
        assert SHARE_RPM - 2 <= served[member] <= SHARE_RPM, served
    assert all(o == "ok" for _p, _r, o in outcomes[:6]), outcomes[:6]  # each person through each router
    for person, _r, message in outcomes:
        if message == "ok":
            continue
        named = "person 'pat'" if person == "pat" else f"member '{person}@project/shares'"
        limit = OWN_RPM if person == "pat" else SHARE_RPM
        assert named in message and f"{limit} requests per minute" in message, message
    # Usage by person: every request each sent, the refusals as errors (the routers flushed on stopping).
    rows = {
        row["person"]: row for row in json.loads(cli("usage", "--by", "person", "--json", "--store", pg_dsn))
    }
    for person in keys:
        asked = sum(1 for q, _r, _o in outcomes if q == person)
        assert (rows[person]["requests"], rows[person]["errors"]) == (asked, asked - served[person]), rows
