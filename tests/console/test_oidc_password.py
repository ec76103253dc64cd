"""A person signs in to the console with a password where no identity provider is configured (issue 44): an admin
issues a one-time link from the People page, the person sets their password through it, signs in, keeps notes and
finds them, has their threads page; their sessions are capped, failed sign-ins held back, and a person the repo
stops declaring is signed out at their next request. Real controller, store and HTTP; the browser side of the
same path is in test_oidc_browser.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from controller.helpers import Repo, cluster_yaml, settings_for
from support import wait_for

from llmgw.controller.app import RunningController, start_controller
from llmgw.controller.console.passwords import FAILURES_ALLOWED, hash_password, held_back, verify_password
from llmgw.controller.console.sessions import MAX_SESSIONS_PER_PERSON

PEOPLE = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Person
metadata: {name: ada}
spec:
  email: ada@example.com
  memberships: [{project: playground}]
"""
PASSWORD = "correct horse battery staple"


@dataclass
class Console:
    running: RunningController
    repo: Repo

    @property
    def url(self) -> str:
        return self.running.url


@pytest.fixture
async def console(tmp_path: Path) -> AsyncIterator[Console]:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "tenants.yaml": PEOPLE})
    running = await start_controller(settings_for(tmp_path, repo.path))
    try:
        yield Console(running, repo)
    finally:
        await running.stop()


def _jar() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # an IP host


async def _csrf(s: aiohttp.ClientSession, url: str, field: str = 'name="csrf" value') -> str:
    async with s.get(url) as r:
        found = re.search(field + r'="([^"]+)"', await r.text())
    assert r.status == 200 and found is not None, url
    return found.group(1)


async def _admin(c: Console) -> tuple[aiohttp.ClientSession, str]:
    s = _jar()
    csrf = await _csrf(s, c.url + "/ui/login")
    async with s.post(c.url + "/ui/login", data={"csrf": csrf, "token": c.running.admin_token}) as r:
        assert r.status == 200
    return s, await _csrf(s, c.url + "/ui/people", 'name="csrf-token" content')


async def _password_link(c: Console, person: str = "ada") -> str:
    s, csrf = await _admin(c)
    async with s:
        async with s.post(f"{c.url}/ui/people/{person}/password-link", data={"csrf": csrf}) as r:
            text = await r.text()
        assert r.status == 200, text
        link = re.search(r'<code id="password-link">([^<]+)</code>', text)
        assert link is not None
        return link.group(1)


async def _sign_in(
    c: Console, s: aiohttp.ClientSession, person: str, password: str
) -> aiohttp.ClientResponse:
    csrf = await _csrf(s, c.url + "/ui/login")
    data = {"csrf": csrf, "person": person, "password": password}
    async with s.post(c.url + "/ui/login/person", data=data, allow_redirects=False) as r:
        await r.read()
        return r


async def test_a_person_sets_a_password_through_a_link_and_signs_in(console: Console) -> None:
    c = console
    link = await _password_link(c)
    async with _jar() as s:
        async with s.post(link, data={"password": PASSWORD, "again": PASSWORD + "x"}) as r:
            assert r.status == 400 and "the two passwords differ" in await r.text()
        async with s.post(link, data={"password": "short", "again": "short"}) as r:
            assert r.status == 400 and "at least 12 characters" in await r.text()
        async with s.post(link, data={"password": PASSWORD, "again": PASSWORD}, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/ui/login?done=password"
        async with s.post(link, data={"password": PASSWORD, "again": PASSWORD}) as r:
            assert r.status == 403, "a link sets one password, once"
        stored = await c.running.controller.store.password_of("ada")
        assert stored is not None and stored.startswith("scrypt$") and PASSWORD not in stored

        assert (await _sign_in(c, s, "ada", "wrong password!")).status == 401
        assert (await _sign_in(c, s, "nobody", PASSWORD)).status == 401
        r = await _sign_in(c, s, "ada", PASSWORD)
        assert r.status == 303 and r.headers["Location"] == "/ui/chat"
        csrf = await _csrf(s, c.url + "/ui/chat", 'name="csrf-token" content')
        async with s.get(c.url + "/ui/chat/threads") as r:
            assert r.status == 200 and "No threads" in await r.text()
        note = {"csrf": csrf, "title": "GPU order", "body": "Ask finance about the H100s"}
        async with s.post(c.url + "/ui/notes", data=note) as r:
            assert r.status == 200
        async with s.get(c.url + "/ui/notes", params={"q": "h100*"}) as r:
            assert r.status == 200 and "Ask finance about the H100s" in await r.text()
        async with s.get(c.url + "/ui/notes", params={"q": "budget"}) as r:
            assert "No note holds every word of it." in await r.text()
        async with s.get(c.url + "/ui/nodes") as r:
            assert r.status == 403 and "ada (person)" in await r.text(), "a person is no admin"


async def test_sessions_are_capped_per_person_and_failures_held_back(console: Console) -> None:
    c = console
    ctl = c.running.controller
    await ctl.store.set_password("ada", hash_password(PASSWORD), ctl.wall())
    first = _jar()
    try:
        assert (await _sign_in(c, first, "ada", PASSWORD)).status == 303
        async with first.get(c.url + "/ui/notes", allow_redirects=False) as r:
            assert r.status == 200
        for _ in range(MAX_SESSIONS_PER_PERSON):
            async with _jar() as later:
                assert (await _sign_in(c, later, "ada", PASSWORD)).status == 303
        async with first.get(c.url + "/ui/notes", allow_redirects=False) as r:
            assert r.status == 303, "the oldest of ada's sessions made way for the newest"
        for _ in range(FAILURES_ALLOWED):
            assert (await _sign_in(c, first, "ada", "not the password")).status == 401
        r = await _sign_in(c, first, "ada", PASSWORD)
        assert r.status == 429, "held back even with the right password, until the window passes"
    finally:
        await first.close()


async def test_a_person_the_repo_stops_declaring_is_signed_out_at_once(console: Console) -> None:
    c = console
    ctl = c.running.controller
    await ctl.store.set_password("ada", hash_password(PASSWORD), ctl.wall())
    async with _jar() as s:
        assert (await _sign_in(c, s, "ada", PASSWORD)).status == 303
        before = ctl.desired.revision if ctl.desired is not None else None
        c.repo.write({"tenants.yaml": PEOPLE.split("---\napiVersion: llmgw/v1\nkind: Person")[0]})
        wait_for_revision = lambda: ctl.desired is not None and ctl.desired.revision != before  # noqa: E731
        await wait_for(wait_for_revision, 10, "the controller to apply the repo without ada")
        async with s.get(c.url + "/ui/notes", allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/ui/login?expired=1"
        assert (await _sign_in(c, s, "ada", PASSWORD)).status == 401, "no longer a person here"


def test_passwords_are_scrypt_and_failures_hold_for_a_window() -> None:
    encoded = hash_password(PASSWORD)
    assert verify_password(PASSWORD, encoded) and not verify_password(PASSWORD + " ", encoded)
    assert hash_password(PASSWORD) != encoded, "salted"
    assert held_back([1.0] * (FAILURES_ALLOWED - 1), 2.0) is None
    assert held_back([1.0] * FAILURES_ALLOWED, 2.0) == pytest.approx(299.0)
    assert held_back([1.0] * FAILURES_ALLOWED, 302.0) is None, "the window passed"
