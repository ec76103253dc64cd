"""Small pure-ish parts: key auth and its cache, the admission queue, tenancy, engine keys, the snapshot model."""

from __future__ import annotations

import asyncio

import pytest
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.routing.admission import Admission
from llmgw_router.server.errors import ApiError
from support import wait_for

from llmgw.adapters.keys import hash_key
from llmgw.core.security import ENGINE_KEY_PREFIX, engine_key, forbidden_address_reason
from llmgw.core.snapshot import RouterSnapshot
from llmgw.core.tenancy.projects import allowed, tenant_chain
from llmgw.store.records import KeyLookup

KEY = "sk-llmgw-" + "k" * 43


class FakeKeys:
    def __init__(self, answer: KeyLookup | None) -> None:
        self.answer = answer
        self.calls = 0

    async def lookup_key(self, key_hash: str) -> KeyLookup | None:
        assert key_hash == hash_key(KEY)  # only the hash ever reaches the store
        self.calls += 1
        return self.answer


async def test_auth_caches_answers_for_the_ttl() -> None:
    now = [0.0]
    store = FakeKeys(KeyLookup("id1", "p1", "active", None))
    auth = Authenticator(store, clock=lambda: now[0], ttl=10)
    for _ in range(5):
        assert (await auth.authenticate(f"Bearer {KEY}")).project == "p1"
    assert store.calls == 1
    store.answer = KeyLookup("id1", "p1", "revoked", None)
    now[0] = 11.0
    with pytest.raises(ApiError) as revoked:
        await auth.authenticate(f"Bearer {KEY}")
    assert (revoked.value.status, revoked.value.code) == (401, "key_revoked")
    assert KEY not in revoked.value.message  # never echo a whole key


class GatedKeys(FakeKeys):
    """A key store whose lookups wait until the test opens the gate: what is asked while one is under way."""

    def __init__(self, answer: KeyLookup | None) -> None:
        super().__init__(answer)
        self.gate = asyncio.Event()

    async def lookup_key(self, key_hash: str) -> KeyLookup | None:
        self.calls += 1
        await self.gate.wait()
        return self.answer


async def test_auth_asks_the_store_once_for_a_burst_on_a_key_it_has_no_answer_for() -> None:
    store = GatedKeys(KeyLookup("id1", "p1", "active", None))
    auth = Authenticator(store, clock=lambda: 0.0, ttl=10)
    burst = [asyncio.create_task(auth.authenticate(f"Bearer {KEY}")) for _ in range(12)]
    await wait_for(lambda: store.calls > 0 or None, 5, "the first lookup")
    await asyncio.sleep(0)  # every request of the burst has reached the cache by now
    store.gate.set()
    assert [p.project for p in await asyncio.gather(*burst)] == ["p1"] * 12
    assert store.calls == 1


async def test_auth_looks_a_key_in_use_up_again_before_its_answer_expires_without_making_it_wait() -> None:
    now = [0.0]
    store = GatedKeys(KeyLookup("id1", "p1", "active", None))
    store.gate.set()
    auth = Authenticator(store, clock=lambda: now[0], ttl=10)
    assert (await auth.authenticate(f"Bearer {KEY}")).project == "p1"
    now[0] = 7.0  # not yet in the last fifth of the TTL: no lookup
    assert (await auth.authenticate(f"Bearer {KEY}")).project == "p1"
    assert store.calls == 1
    store.gate.clear()
    store.answer = KeyLookup("id1", "p1", "revoked", None)
    now[0] = 8.5  # in the last fifth: served from the cache at once while the store is asked again
    assert (await auth.authenticate(f"Bearer {KEY}")).project == "p1"
    assert (await auth.authenticate(f"Bearer {KEY}")).project == "p1"
    await wait_for(lambda: store.calls == 2 or None, 5, "the lookup ahead of expiry")
    store.gate.set()
    await wait_for(lambda: not auth._lookups or None, 5, "the lookup ahead of expiry to end")
    assert store.calls == 2
    with pytest.raises(ApiError) as revoked:  # the new answer, asked at 8.5, holds from then
        await auth.authenticate(f"Bearer {KEY}")
    assert revoked.value.code == "key_revoked"


@pytest.mark.parametrize(
    ("header", "answer", "code"),
    [
        (None, None, "missing_api_key"),
        ("Basic abc", None, "invalid_api_key"),
        (f"Bearer {KEY}", None, "invalid_api_key"),
        (f"Bearer {KEY}", KeyLookup("i", "p", "expired", 5.0), "key_expired"),
        (f"Bearer {KEY}", KeyLookup("i", "p", "active", 5.0), "key_expired"),  # expiry passed since caching
    ],
)
async def test_auth_refusals_are_precise(header: str | None, answer: KeyLookup | None, code: str) -> None:
    auth = Authenticator(FakeKeys(answer), clock=lambda: 100.0)
    with pytest.raises(ApiError) as err:
        await auth.authenticate(header)
    assert (err.value.status, err.value.code) == (401, code)


async def test_disabled_auth_is_anonymous_and_static_keys_parse() -> None:
    assert (await Authenticator(None).authenticate(None)).project is None
    keys = StaticKeys.from_file_lines(["# comment", f"sha256:{hash_key(KEY)} proj", ""])
    assert (await Authenticator(keys).authenticate(f"Bearer {KEY}")).project == "proj"
    with pytest.raises(ValueError, match="keys:1"):
        StaticKeys.from_file_lines(["nothex proj"])


async def test_admission_is_fifo_bounded_and_times_out() -> None:
    rejected: list[str] = []
    adm = Admission(2, on_reject=rejected.append)
    room = {"n": 0}
    order: list[int] = []

    def has_room() -> bool:
        if room["n"] > 0:
            room["n"] -= 1
            return True
        return False

    async def waiter(i: int) -> None:
        await adm.wait("m", has_room, 30)
        order.append(i)

    first = asyncio.create_task(waiter(1))
    await wait_for(lambda: adm.depth == 1, 10.0, "the first waiter queued")
    second = asyncio.create_task(waiter(2))
    await wait_for(lambda: adm.depth == 2, 10.0, "the second waiter queued behind it")
    with pytest.raises(ApiError) as full:
        await adm.wait("m", has_room, 30)
    assert full.value.code == "queue_full" and full.value.headers["Retry-After"]
    room["n"] = 1
    adm.notify("m")
    await first
    room["n"] = 1
    adm.notify("m")
    await second
    assert order == [1, 2]
    with pytest.raises(ApiError) as late:
        await adm.wait("m", has_room, 0.05)
    assert late.value.code == "queue_timeout" and late.value.status == 429
    assert rejected == ["queue_full", "timeout"] and adm.depth == 0


def test_tenancy_every_listing_level_must_allow() -> None:
    snap = RouterSnapshot.model_validate(
        {
            "revision": "x",
            "tenants": {
                "organizations": {"acme": {"models": ["sim-*", "gemma"]}},
                "teams": {"research": {"organization": "acme"}},
                "projects": {
                    "p": {"team": "research", "models": ["sim-chat", "other"], "limits": {"rpm": 5}},
                    "q": {"organization": "acme"},
                },
            },
        }
    )
    t = snap.tenants
    assert allowed(t, "p", ("sim-chat",))
    assert not allowed(t, "p", ("other",))  # the project lists it, the organization does not
    assert allowed(t, "q", ("gemma",)) and not allowed(t, "q", ("llama",))
    assert not allowed(t, "nobody", ("sim-chat",))
    chain = tenant_chain(t, "p")
    assert chain is not None and (chain.team, chain.organization) == ("research", "acme")
    assert [(t.level, t.name) for t in chain.levels] == [
        ("organization", "acme"),
        ("team", "research"),
        ("project", "p"),
    ]
    assert chain.levels[-1].limits.rpm == 5


def test_engine_key_is_a_stable_hmac_per_replica() -> None:
    a = engine_key(b"secret", "replica-1")
    assert a.startswith(ENGINE_KEY_PREFIX) and len(a) == len(ENGINE_KEY_PREFIX) + 64
    assert a == engine_key(b"secret", "replica-1")
    assert a != engine_key(b"secret", "replica-2") and a != engine_key(b"other", "replica-1")
    with pytest.raises(ValueError):
        engine_key(b"", "r")


@pytest.mark.parametrize(
    ("url", "refused"),
    [
        ("http://169.254.169.254/latest/meta-data", True),
        ("http://[fe80::1]:8080/v1", True),
        ("http://metadata.google.internal/v1", True),
        ("https://api.example.com/v1", False),
        ("http://10.0.0.5:8000/v1", False),
    ],
)
def test_metadata_and_link_local_addresses_are_refused(url: str, refused: bool) -> None:
    assert (forbidden_address_reason(url) is not None) == refused


def test_snapshot_ignores_unknown_fields_from_a_newer_controller() -> None:
    snap = RouterSnapshot.model_validate(
        {
            "revision": "r",
            "future_field": 1,
            "endpoints": [
                {"replica_id": "a", "model": "m", "engine": "sim", "base_url": "http://x", "new": True}
            ],
        }
    )
    assert snap.endpoints[0].state == "ready" and snap.endpoints[0].weight == 1.0
