"""L13: console sessions. A login loop with one project key cannot log an admin out; the session cookie is
`Secure` by setting when TLS ends at a proxy; a tenant's session fails closed once a store outage outlasts a
grace (a key revoked meanwhile must not keep its session).

The exploits as the review sketches them: any holder of one active project key loops logins until the
10,000-session cap evicts every admin's session; behind a TLS-terminating proxy `request.secure` is false, so
the cookie went out without `Secure`; while the store is down `_key_still_active` said yes for ever.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for

from llmgw.adapters import keys as keymod
from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.console.sessions import KEY_RECHECK_S, MAX_SESSIONS, Sessions
from llmgw.controller.parts.admin_tokens import AdminPrincipal
from llmgw.store import StoreError

pytestmark = pytest.mark.integration


def test_l13_a_login_loop_with_one_project_key_never_logs_an_admin_out() -> None:
    now = [1000.0]
    sessions = Sessions(lambda: now[0], ttl_s=8 * 3600.0)
    admin = sessions.open_admin(AdminPrincipal("admin", "admin"))
    for _ in range(MAX_SESSIONS + 1):
        now[0] += 0.001  # each later login expires later: the admin's is the soonest to expire
        sessions.open_tenant("key-of-mallory", "playground", "llmgw-key")
    assert sessions.get(admin.id)[0] is admin, "the admin was logged out by a tenant's login loop"
    assert len(sessions.by_id) <= 21


@pytest.fixture
async def running(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[RunningController]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    extra: dict[str, Any] = getattr(request, "param", {})
    started = await start_controller(settings_for(tmp_path, repo.path, **extra))
    try:
        yield started
    finally:
        await started.stop()


async def _login(s: aiohttp.ClientSession, url: str, token: str) -> aiohttp.ClientResponse:
    async with s.get(url + "/ui/login") as r:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text())
        assert csrf is not None
    async with s.post(
        url + "/ui/login", data={"csrf": csrf.group(1), "token": token}, allow_redirects=False
    ) as r:
        assert r.status == 303, await r.text()
        return r


@pytest.mark.parametrize("running", [{"console_cookie_secure": "always"}], indirect=True)
async def test_l13_the_cookie_is_secure_by_setting_behind_a_tls_proxy(running: RunningController) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        r = await _login(s, running.url, running.admin_token)
    assert r.cookies["llmgw_console"]["secure"], "served over plain HTTP, as behind a TLS proxy: still Secure"


async def test_l13_a_loopback_controller_without_tls_keeps_a_plain_cookie(running: RunningController) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        r = await _login(s, running.url, running.admin_token)
        assert not r.cookies["llmgw_console"][
            "secure"
        ]  # `llmgw up` on loopback: the browser must send it back
        async with s.get(running.url + "/ui/nodes", allow_redirects=False) as page:
            assert page.status == 200


async def test_l13_a_tenant_session_fails_closed_when_the_store_outage_outlasts_the_grace(
    running: RunningController, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctl = running.controller
    key = await keymod.create_key(ctl.store, "default", ctl.wall(), name="tenant")
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
        r = await _login(s, running.url, key.plaintext)
        session = running.console.sessions.by_id[r.cookies["llmgw_console"].value]

        async def store_down(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("the store is down")

        monkeypatch.setattr(keymod, "lookup", store_down)
        session.key_checked_at = ctl.wall() - KEY_RECHECK_S - 1  # due for a recheck, within the grace
        async with s.get(running.url + "/ui/tenants", allow_redirects=False) as page:
            assert page.status == 200, "a short outage keeps the session"
        session.key_checked_at = ctl.wall() - 86400.0  # a day-long outage: past any grace (default 2 minutes)
        async with s.get(running.url + "/ui/tenants", allow_redirects=False) as page:
            assert page.status == 303 and page.headers["Location"] == "/ui/login?expired=1"
        assert session.id not in running.console.sessions.by_id
