"""The scrape loop: read every endpoint's metrics about once per scrape_interval, with its engine's names.

A failed scrape is counted and leaves the last reading in place until stale_after makes the endpoint count
as saturated; it never touches the breaker (an engine may serve fine while its metrics page is down). A
contract violation (a mapped name the page lacks) is logged at warning once when it starts and once when it
clears, not per scrape: at the default log level a per-scrape debug line says nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from llmgw.core.errors import Outage
from llmgw_router.decisions.scrape_parse import Sample, ScrapeError, parse_metrics
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.table import LiveEndpoint, RoutingTable
from llmgw_router.upstream.egress import ForbiddenAddress

__all__ = ["MAX_SCRAPE_BYTES", "scrape_loop", "scrape_once"]

# vLLM's page with its histograms is a few hundred KiB; a page past this is not a metrics page.
MAX_SCRAPE_BYTES = 8 * 1024 * 1024

log = logging.getLogger(__name__)


async def _fetch(session: aiohttp.ClientSession, ep: LiveEndpoint, limit_seconds: float) -> str | ScrapeError:
    assert ep.metrics_url is not None
    # llama.cpp guards /metrics with its key; the others ignore it, so it is always sent.
    headers = {"Authorization": f"Bearer {ep.spec.api_key}"} if ep.spec.api_key else {}
    try:
        # No redirects: an engine (or whoever answers at its address) must not point the router elsewhere.
        async with session.get(
            ep.metrics_url,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=limit_seconds),
            allow_redirects=False,
        ) as resp:
            if resp.status != 200:
                return ScrapeError(f"{ep.metrics_url} answered {resp.status}")
            body = bytearray()
            async for data in resp.content.iter_any():
                body += data
                if len(body) > MAX_SCRAPE_BYTES:
                    return ScrapeError(f"{ep.metrics_url} sent more than {MAX_SCRAPE_BYTES} bytes")
            return body.decode("utf-8", errors="replace")
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return ScrapeError(f"{ep.metrics_url} unreachable: {_why(exc)}")


def _why(exc: BaseException) -> str:
    # A refused address says which rule refused it; other failures are named by their kind.
    cause = getattr(exc, "os_error", None)
    if isinstance(cause, ForbiddenAddress):
        return str(cause)
    return type(exc).__name__


def _note(ep: LiveEndpoint, result: Sample | ScrapeError, now: float, metrics: RouterMetrics) -> None:
    missing = result.missing
    if missing and not ep.violation:
        log.warning(
            "endpoint %s (%s, engine %s): metric contract violation: %s not served at %s; check the engine's "
            "metric mapping (and that metrics are enabled)",
            ep.id,
            ep.spec.model,
            ep.spec.engine,
            ", ".join(missing),
            ep.metrics_url,
        )
    elif ep.violation and not missing and isinstance(result, Sample):
        log.warning("endpoint %s (%s): metric contract violation cleared", ep.id, ep.spec.model)
    if isinstance(result, Sample):
        ep.violation = missing
        ep.sample = result
        ep.last_scraped = now
        if ep.scrape_error is not None:
            log.info("endpoint %s: scraping works again", ep.id)
        ep.scrape_error = None
        return
    if missing:
        ep.violation = missing
    metrics.scrape_errors.labels(ep.id).inc()
    if ep.scrape_error is None:
        log.warning("endpoint %s (%s): scrape failed: %s", ep.id, ep.spec.model, result.reason)
    else:
        log.debug("endpoint %s: scrape failed: %s", ep.id, result.reason)
    ep.scrape_error = result.reason


async def scrape_once(
    session: aiohttp.ClientSession, table: RoutingTable, metrics: RouterMetrics, clock: Callable[[], float]
) -> None:
    endpoints = [ep for ep in table.all_endpoints() if not ep.is_provider and ep.metrics_url]
    timeout = max(1.0, 2 * table.scrape_interval)
    texts = await asyncio.gather(*(_fetch(session, ep, timeout) for ep in endpoints))
    now = clock()
    for ep, text in zip(endpoints, texts, strict=True):
        assert ep.names is not None
        result = text if isinstance(text, ScrapeError) else parse_metrics(text, ep.names)
        _note(ep, result, now, metrics)


async def scrape_loop(
    session: aiohttp.ClientSession,
    table: Callable[[], RoutingTable | None],
    metrics: RouterMetrics,
    clock: Callable[[], float],
    on_round: Callable[[], None] | None = None,
) -> None:
    """Scrape every endpoint of the current table once per its scrape_interval, until cancelled."""
    loop = asyncio.get_running_loop()
    failing = Outage(log, "a scrape round")
    while True:
        started = loop.time()
        current = table()
        interval = current.scrape_interval if current else 1.0
        if current is not None:
            # Like every background loop: a round that fails (a bug, a page the parser chokes on) is logged
            # once and the next one tries again; a dead scrape loop would leave every reading to go stale.
            try:
                await scrape_once(session, current, metrics, clock)
                if on_round is not None:
                    on_round()
                failing.recovered()
            except Exception as exc:
                failing.failed(exc, interval)
        await asyncio.sleep(max(0.05, interval - (loop.time() - started)))
