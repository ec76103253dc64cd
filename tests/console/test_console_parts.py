"""The console without a browser: `llmgw up`'s one-time login link, the redirects and refusals of a request
without a session, the security headers, and the vendored assets still being what VENDORED.json records."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import aiohttp
from controller.helpers import Repo, cluster_yaml, model_yaml, settings_for

from llmgw.adapters.keys import create_key
from llmgw.cli.deploy.up import console_text
from llmgw.controller.app import start_controller

STATIC = Path(__file__).resolve().parents[2] / "llmgw" / "controller" / "console" / "static"
VENDOR = Path(__file__).resolve().parent / "vendor"


def test_vendored_files_are_what_their_records_say() -> None:
    for folder in (STATIC, VENDOR):
        record = json.loads((folder / "VENDORED.json").read_text())
        for name, entry in record["files"].items():
            digest = hashlib.sha256((folder / name).read_bytes()).hexdigest()
            assert digest == entry["sha256"], (
                f"{folder / name} changed: re-vendor it and record the new sha256"
            )
            assert entry["version"] and entry["package"]


async def test_up_prints_the_console_and_a_login_link_that_works_once(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    running = await start_controller(settings_for(tmp_path, repo.path))
    try:
        text = console_text(running)
        assert text.splitlines()[0] == f"console: {running.url}/ui/"
        link = re.search(r"(http://\S+/ui/login/once/\S+);", text)
        assert link is not None, text
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:  # an IP host
            async with s.get(link.group(1), allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/ui/"
                cookie = r.cookies["llmgw_console"]
                assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/ui/"
            async with s.get(running.url + "/ui/nodes", allow_redirects=False) as r:
                assert r.status == 200, "the link's session opens the console"
                assert "Content-Security-Policy" in r.headers and r.headers["X-Frame-Options"] == "DENY"
        async with aiohttp.ClientSession() as fresh, fresh.get(link.group(1), allow_redirects=False) as r:
            assert r.status == 403, "a one-time link opens one session only"
    finally:
        await running.stop()


async def test_without_a_session_pages_send_to_login_and_htmx_gets_401(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml()})
    running = await start_controller(settings_for(tmp_path, repo.path))
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:  # an IP host
            async with s.get(running.url + "/ui/models", allow_redirects=False) as r:
                assert r.status == 303 and r.headers["Location"] == "/ui/login"
            async with s.get(running.url + "/ui/models", headers={"HX-Request": "true"}) as r:
                assert r.status == 401 and r.headers["HX-Redirect"] == "/ui/login"
            async with s.post(running.url + "/ui/logout") as r:
                assert r.status == 401
            async with s.get(running.url + "/ui/login") as r:
                assert r.status == 200
                nonce = re.search(r'name="csrf" value="([^"]+)"', await r.text())
                assert nonce is not None
            async with s.post(
                running.url + "/ui/login", data={"csrf": nonce.group(1), "token": "wrong"}
            ) as r:
                assert r.status == 401 and "not an admin token nor an active project key" in await r.text()
            async with s.get(running.url + "/ui/static/htmx.min.js") as r:
                assert r.status == 200 and r.content_type == "text/javascript"
            async with s.get(running.url + "/ui/static/..%2fweb.py") as r:
                assert r.status == 404
    finally:
        await running.stop()


class _Standby:
    """Stands for a leader lease held by another controller (llmgw.controller.parts.lease.LeaderLease's answer)."""

    def leading(self) -> bool:
        return False


async def test_a_standby_serves_pages_but_refuses_console_posts(tmp_path: Path) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    running = await start_controller(settings_for(tmp_path, repo.path))
    ctl = running.controller
    key = await create_key(ctl.store, "default", ctl.wall(), name="kept")
    try:
        text = console_text(running)
        link = re.search(r"(http://\S+/ui/login/once/\S+);", text)
        assert link is not None
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as s:
            async with s.get(link.group(1)) as r:
                csrf = re.search(r'name="csrf-token" content="([^"]+)"', await r.text())
                assert r.status == 200 and csrf is not None
            ctl.lease = _Standby()  # type: ignore[assignment]
            async with s.get(running.url + "/ui/nodes") as r:
                assert r.status == 200, "a standby serves the pages from its own view"
            url = f"{running.url}/ui/keys/{key.key.id}/revoke"
            async with s.post(url, data={"csrf": csrf.group(1)}, allow_redirects=False) as r:
                assert r.status == 503 and "standby" in await r.text()
            assert (await ctl.store.get_key(key.key.id)).revoked_at is None  # type: ignore[union-attr]
            ctl.lease = None
            async with s.post(url, data={"csrf": csrf.group(1)}, allow_redirects=False) as r:
                assert r.status == 303, "the same POST on a leader revokes"
            assert (await ctl.store.get_key(key.key.id)).revoked_at is not None  # type: ignore[union-attr]
    finally:
        ctl.lease = None
        await running.stop()
