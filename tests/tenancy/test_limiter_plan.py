"""The limiter's per-chain plan (worked out once per chain, found by the chain's identity): reusing one chain
object, as the router does, decides exactly as a fresh chain per request does; a new chain with other limits
(a new revision) applies at once."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st
from llmgw_router.path.ratelimit import MemoryCounters

from llmgw.core.tenancy.limits import Budget, Estimate, LevelLimits, LimitRefused, Tenant
from llmgw.store.limits.limiter import PoolAdmission, PoolLimiter

T0 = 1_200_000.0  # the start of a minute window


def chain(rpm: int = 20, tpm: int = 500, concurrency: int = 3, budget: float = 0.05) -> tuple[Tenant, ...]:
    return (
        Tenant("organization", "acme", LevelLimits(budget=Budget(budget, 3600))),
        Tenant("team", "research", LevelLimits(concurrency=concurrency)),
        Tenant("project", "p", LevelLimits(rpm=rpm, tpm=tpm)),
    )


ops = st.lists(
    st.tuples(
        st.integers(1, 120),  # estimated tokens
        st.integers(0, 150),  # tokens really used
        st.booleans(),  # finish it at once (else it stays in flight a while)
        st.sampled_from([0.0, 0.5, 20.0]),  # clock step before it
    ),
    max_size=60,
)


class GeneralPathOnly(PoolLimiter):
    """The limiter with its no-wait path switched off: every request goes through `decide`."""

    def _admit_from_shares(self, *args: object) -> None:
        return None


class CountingFastPath(PoolLimiter):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fast = 0

    def _admit_from_shares(self, *args: object) -> PoolAdmission | None:
        got = super()._admit_from_shares(*args)  # type: ignore[arg-type]
        self.fast += got is not None
        return got


async def _run(
    steps: list[tuple[int, int, bool, float]], reuse: bool, kind: type[PoolLimiter] = PoolLimiter
) -> list[object]:
    now = [T0]
    limiter = kind(MemoryCounters(), clock=lambda: now[0])
    shared = chain()
    out: list[object] = []
    held: list[PoolAdmission] = []
    for estimate, used, at_once, step in steps:
        now[0] += step
        got = await limiter.admit(shared if reuse else chain(), Estimate(estimate, estimate / 1e4))
        if isinstance(got, LimitRefused):
            out.append((got.level, got.metric, got.retry_after, got.headers))
            if held:
                limiter.finish(held.pop(0), used, used / 1e4)
            continue
        out.append(got.headers)
        if at_once:
            limiter.finish(got, used, used / 1e4)
        else:
            held.append(got)
    return out


@settings(max_examples=60, deadline=None)
@given(ops)
async def test_one_chain_object_decides_as_fresh_chains_do(steps: list[tuple[int, int, bool, float]]) -> None:
    assert await _run(steps, reuse=True) == await _run(steps, reuse=False)


@settings(max_examples=80, deadline=None)
@given(ops)
async def test_admitting_without_waiting_decides_as_decide_does(
    steps: list[tuple[int, int, bool, float]],
) -> None:
    # Same answers, same x-ratelimit-* headers, same refusals, whether or not the shortcut is taken.
    assert await _run(steps, reuse=True) == await _run(steps, reuse=True, kind=GeneralPathOnly)


async def test_most_requests_take_the_shortcut() -> None:
    limiter = CountingFastPath(MemoryCounters(), clock=lambda: T0 + 1)
    for _ in range(50):
        assert isinstance(
            await limiter.admit(chain(rpm=1000, tpm=10**6, concurrency=100), Estimate(10)), PoolAdmission
        )
    assert limiter.fast >= 40  # only the requests that found a share short went to the store


async def test_a_new_revision_s_limits_apply_at_once() -> None:
    limiter = PoolLimiter(MemoryCounters(), clock=lambda: T0 + 1)
    old = chain(rpm=5, concurrency=100)
    for _ in range(3):
        assert isinstance(await limiter.admit(old, Estimate(1)), PoolAdmission)
    tighter = await limiter.admit(chain(rpm=3, concurrency=100), Estimate(1))
    assert isinstance(tighter, LimitRefused) and (tighter.metric, tighter.limit) == ("requests", 3)
    assert isinstance(await limiter.admit(chain(rpm=10, concurrency=100), Estimate(1)), PoolAdmission)
