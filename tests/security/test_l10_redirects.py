"""L10: a redirect to a literal refused address is refused by every fetcher of weights-like things.

aiohttp calls no resolver for a literal address, so `CheckedResolver` alone never saw a `Location:
http://169.254.169.254/…`. The exploit as the review sketches it: a server the repo (or a pull request) names
answers 302 to the metadata address, and the engine-archive fetch (agent), `llmgw plan`'s manifest read (CI)
and `llmgw mirror`/inspect follow it. Each now follows redirects by hand (`weights.following`, `check_url` per
hop), and the checked session refuses the address at connect time even when aiohttp follows one itself.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from llmgw_agent.installs import _fetch_archive
from llmgw_agent.weights import WeightsError, checked_session
from support import answering

from llmgw.adapters.model_files import InspectError, inspect_source
from llmgw.adapters.source_probe import check_sources
from llmgw.core.plan.source_check import SourceToCheck

pytestmark = pytest.mark.integration

METADATA = "http://169.254.169.254:80/latest/meta-data/"


def redirecting_to(location: str) -> AbstractAsyncContextManager[str]:
    """A loopback server that answers every request with a 302 to `location`; its base URL."""

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(location)

    return answering(redirect)


async def test_the_engine_archive_fetch_refuses_a_redirect_to_the_metadata_address(tmp_path: Path) -> None:
    async with redirecting_to(METADATA) as base:
        with pytest.raises(WeightsError, match=r"169\.254\.169\.254.*link-local"):
            await _fetch_archive(base + "/engine.tar.gz", tmp_path / "archive.download")
    assert not (tmp_path / "archive.download").exists()


async def test_plans_manifest_read_refuses_a_redirect_to_the_metadata_address() -> None:
    async with redirecting_to(METADATA) as base:
        item = SourceToCheck(
            "m", base + "/model/", "models/m.yaml:3:5", (base + "/model/",), read_manifest=True
        )
        [verdict] = await check_sources([item])
    assert verdict.state == "not checked"
    assert "169.254.169.254" in verdict.detail and "link-local" in verdict.detail, verdict.detail


async def test_inspect_refuses_a_redirect_to_the_metadata_address() -> None:
    async with redirecting_to(METADATA) as base:
        with pytest.raises(InspectError, match=r"169\.254\.169\.254.*link-local"):
            await inspect_source(base + "/model.gguf")


async def test_the_checked_session_refuses_a_literal_address_at_connect_time() -> None:
    """The connection-level check: even a redirect aiohttp follows itself never reaches the literal."""
    async with redirecting_to(METADATA) as base, checked_session() as session:
        with pytest.raises(aiohttp.ClientConnectorError) as refused:
            await session.get(base + "/anything")
    assert isinstance(refused.value.os_error, WeightsError)
    assert "169.254.169.254" in str(refused.value.os_error) and "link-local" in str(refused.value.os_error)
