"""People sign in to the console in Chromium (issue 44): through a real OpenID Connect provider on loopback (npm
`oidc-provider`, OpenID Certified: its own login and consent pages, PKCE required of the client, ID tokens signed
with a key of its JWKS), holding what the provider's groups give until the provider stops listing them; and with a
password set through the link an admin issues on the People page."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from clients.gateway import NODE_DIR
from controller.helpers import Repo, cluster_yaml, settings_for
from playwright.async_api import Browser, Page, async_playwright
from support import free_port, wait_for, write_bindings

from console.helpers import chromium
from llmgw.controller.app import RunningController, start_controller

CLIENT_ID, CLIENT_SECRET = "llmgw-console", "a-test-client-secret"
TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: research}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: playground}
spec: {team: research}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: evals}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Person
metadata: {name: ada}
spec:
  email: ada@example.com
  memberships: [{project: playground}]
"""


@dataclass
class Provider:
    issuer: str
    accounts: Path

    def set_groups(self, account: str, groups: list[str]) -> None:
        data = json.loads(self.accounts.read_text())
        data[account]["groups"] = groups
        self.accounts.write_text(json.dumps(data))


@contextlib.contextmanager
def provider(tmp: Path, redirect_uri: str) -> Iterator[Provider]:
    node = shutil.which("node")
    if node is None or not (NODE_DIR / "node_modules" / "oidc-provider").is_dir():
        pytest.fail("node and oidc-provider are needed: `make system-deps node-clients` installs them")
    port = free_port()
    accounts = tmp / "accounts.json"
    ada = {"email": "ada@example.com", "email_verified": True, "groups": ["ml-team", "unmapped"]}
    accounts.write_text(json.dumps({"ada": ada}))
    config = tmp / "provider.json"
    config.write_text(
        json.dumps(
            {
                "port": port,
                "client_id": CLIENT_ID,
                "client_secret": CLIENT_SECRET,
                "redirect_uri": redirect_uri,
                "accounts": str(accounts),
            }
        )
    )
    log = (tmp / "provider.log").open("w")
    proc = subprocess.Popen(
        [node, str(NODE_DIR / "oidc_provider.mjs"), str(config)],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the script prints once it listens, or exits (then: its log)
        assert line.startswith("ready "), f"oidc-provider did not start: {(tmp / 'provider.log').read_text()}"
        yield Provider(line.split()[1], accounts)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        log.close()


def idp_cluster(issuer: str) -> str:
    base: str = cluster_yaml()
    return (
        base
        + f"""\
  console:
    identity_provider:
      issuer: {issuer}
      client_id: {CLIENT_ID}
      client_secret: {{file: oidc-client}}
      scopes: [openid, email, groups]
      groups_claim: groups
      recheck: 0s
      groups:
        ml-team:
          - {{team: research, role: maintainer}}
          - {{project: evals, role: viewer}}
          - {{project: playground, role: viewer}}  # the repo makes ada a member there: the repo wins
"""
    )


async def _provider_applied(running: RunningController) -> None:
    ctl = running.controller

    def applied() -> bool:
        return ctl.desired is not None and ctl.desired.cluster.console.identity_provider is not None

    await wait_for(applied, 15, "the revision with the identity provider applied")


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield b
        await b.close()


async def _signed_in_as(page: Page, person: str) -> None:
    await page.wait_for_url(re.compile(r".*/ui/chat$"))
    assert f"{person} (person)" in await page.locator(".who").inner_text()


async def _held(page: Page, base: str) -> dict[str, tuple[str, str]]:
    """The You page's memberships: scope -> (role, where it comes from)."""
    await page.goto(base + "/ui/me")
    rows = await page.locator("tr[data-scope]").all()
    out = {}
    for row in rows:
        cells = await row.locator("td").all_inner_texts()
        out[str(await row.get_attribute("data-scope"))] = (cells[2], cells[3])
    return out


async def test_a_person_signs_in_through_the_identity_provider(tmp_path: Path, browser: Browser) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "tenants.yaml": TENANTS})
    settings = settings_for(tmp_path, repo.path)
    running = await start_controller(settings)
    try:
        with provider(tmp_path, running.url + "/ui/login/oidc/callback") as idp:
            secrets_dir = Path(settings.secrets_dir)
            write_bindings(
                secrets_dir, [f"oidc-client: {{purposes: [oidc-client-secret], hosts: [{idp.issuer[7:]}]}}"]
            )
            (secrets_dir / "oidc-client").write_text(CLIENT_SECRET + "\n")
            repo.write({"cluster.yaml": idp_cluster(idp.issuer)})
            await _provider_applied(running)

            page = await browser.new_page()
            await page.goto(running.url + "/ui/login")
            await page.get_by_role("link", name=f"Sign in with {idp.issuer}").click()
            await page.wait_for_url(idp.issuer + "/interaction/**")  # the provider's own login page
            await page.fill('input[name="login"]', "ada")
            await page.fill('input[name="password"]', "anything: the provider's development login")
            await page.click('button[type="submit"]')
            await page.get_by_role("button", name="Continue").click()  # its consent page
            await _signed_in_as(page, "ada")
            await page.goto(running.url + "/ui/chat/threads")
            assert await page.get_by_role("heading", name="Your threads", level=1).is_visible()

            assert await _held(page, running.url) == {
                "project/playground": ("member", "repo"),
                "team/research": ("maintainer", "group ml-team"),
                "project/evals": ("viewer", "group ml-team"),
            }
            assert await page.locator("#usable").inner_text() == "playground", (
                "a viewer may not send requests"
            )
            idp.set_groups("ada", [])  # removed from the group at the provider: lost at the next request
            assert await _held(page, running.url) == {"project/playground": ("member", "repo")}
            await page.close()
    finally:
        await running.stop()


async def test_a_person_sets_a_password_from_an_admins_link_and_signs_in(
    tmp_path: Path, browser: Browser
) -> None:
    repo = Repo(tmp_path / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "tenants.yaml": TENANTS})
    running = await start_controller(settings_for(tmp_path, repo.path))
    try:
        admin = await browser.new_page()
        await admin.goto(running.url + "/ui/login")
        await admin.get_by_label("Admin token or project API key").fill(running.admin_token)
        await admin.get_by_role("button", name="Log in").click()
        await admin.goto(running.url + "/ui/people")
        await admin.get_by_role("button", name="Issue a password link for ada").click()
        link = await admin.locator("#password-link").inner_text()
        await admin.close()

        person = await browser.new_page()
        await person.goto(link)
        await person.get_by_label("New password").fill("a long enough password")
        await person.get_by_label("The same again").fill("a long enough password")
        await person.get_by_role("button", name="Set password").click()
        await person.wait_for_url(re.compile(r".*/ui/login\?done=password$"))
        await person.get_by_label("Your name").fill("ada")
        await person.get_by_label("Password", exact=True).fill("a long enough password")
        await person.get_by_role("button", name="Sign in").click()
        await _signed_in_as(person, "ada")
        await person.close()
    finally:
        await running.stop()
