"""The web console in a real browser (Chromium from Debian, driven by Playwright) against a controller, a
router, an agent and sim engines on loopback: login and logout, every page with no console error, no failed
request and no serious accessibility violation (axe-core), the node filters, a key revoked in the console and
then refused by the router, the chat page streaming from a sim model, CSRF-less POSTs and expired sessions
refused, a tenant key seeing only its project. One browser for the module; screenshots go to SCREENSHOTS.
"""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from support import wait_until

from console.helpers import SCREENSHOTS, VENDOR, Cluster, chromium, cluster

playwright_sync = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ADMIN_PAGES = ("/ui/", "/ui/nodes", "/ui/models", "/ui/plan", "/ui/tenants", "/ui/events", "/ui/chat")
AXE = (VENDOR / "axe.min.js").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with cluster(tmp_path_factory.mktemp("console")) as c:

        def ready() -> bool:
            replicas = c.loop.run(_replica_states(c))
            return len(replicas) >= 2 and all(s == "ready" for s in replicas)

        wait_until(ready, 90, "both sim models' replicas ready")
        yield c


async def _replica_states(c: Cluster) -> list[str]:
    from llmgw.controller.status import fleet as views

    ctl = c.running.controller
    return [views.replica_state(ctl, r) for r in list(ctl.replicas.values())]


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with playwright_sync.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        print(f"\nconsole screenshots: {SCREENSHOTS}")
        yield b
        b.close()


class Watched:
    """A page whose console errors, failed requests and HTTP errors are collected."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context()
        self.page = self.context.new_page()
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)
        self.page.on(
            "response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}")
        )

    def _failed(self, request: Any) -> None:
        # An htmx poll in flight when the test navigates away is aborted by the browser: not a failure.
        if request.failure == "net::ERR_ABORTED" and request.headers.get("hx-request") == "true":
            return
        self.problems.append(f"failed: {request.url} {request.failure}")

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def tab(browser: Any) -> Iterator[Watched]:
    w = Watched(browser)
    yield w
    w.close()


def login(w: Watched, base: str, token: str) -> None:
    w.page.goto(base + "/ui/login")
    w.page.get_by_label("Admin token or project API key").fill(token)
    w.page.get_by_role("button", name="Log in").click()
    w.page.wait_for_load_state("load")


def axe_serious(w: Watched) -> list[str]:
    # Evaluated through the DevTools protocol, which the page's CSP does not govern (a script tag it would).
    w.page.evaluate("(source) => { if (!window.axe) { (0, eval)(source); } }", AXE)
    found = w.page.evaluate("async () => (await axe.run(document)).violations")
    return [
        f"{v['id']} ({v['impact']}): {v['help']}" for v in found if v["impact"] in ("critical", "serious")
    ]


def shot(w: Watched, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    w.page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def test_every_page_loads_clean_and_accessible_then_logout(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.admin_token)
    assert tab.page.url.endswith("/ui/")
    cookie = next(c for c in tab.context.cookies() if c["name"] == "llmgw_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["expires"] > 0
    node = next(iter(fleet.running.controller.agents.nodes))
    replica = next(iter(fleet.running.controller.replicas))
    named = {f"/ui/nodes/{node}": "ui-node", f"/ui/replicas/{replica}": "ui-replica"}
    for path in (*ADMIN_PAGES, *named):
        response = tab.page.goto(fleet.url + path)
        assert response is not None and response.status == 200, path
        assert "script-src 'self'" in response.headers["content-security-policy"]
        assert tab.page.locator("h1").count() == 1, path
        assert axe_serious(tab) == [], path
        live = (
            "fetch(location.href, {headers: {'HX-Request': 'true', 'HX-Target': 'live'}}).then(r => r.status)"
        )
        assert tab.page.evaluate(live) == 200, f"{path}: the live region htmx polls renders on its own"
        shot(tab, "admin-" + named.get(path, path.strip("/").replace("/", "-")))
    tab.page.goto(fleet.url + "/ui/")
    tab.page.wait_for_selector(
        "text=Synced"
    )  # the overview's live region says the applied revision is in sync
    assert tab.problems == []
    tab.page.get_by_role("button", name="Log out").click()
    tab.page.wait_for_url(re.compile(r".*/ui/login$"))
    tab.page.goto(fleet.url + "/ui/nodes")
    assert tab.page.url.endswith("/ui/login"), "a logged-out browser is sent to the login page"


def test_filters_narrow_the_node_list(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.admin_token)
    tab.page.goto(fleet.url + "/ui/nodes")
    assert tab.page.locator("table.nodes tbody tr a").count() == 1
    tab.page.get_by_label("State").select_option("Lost")
    tab.page.get_by_role("button", name="Filter").click()
    tab.page.wait_for_url(re.compile(r".*state=Lost.*"))
    assert tab.page.locator("#node-count").inner_text().startswith("0 of 1")
    tab.page.goto(fleet.url + "/ui/nodes?label=no-such-label")
    assert tab.page.locator("#node-count").inner_text().startswith("0 of 1")
    tab.page.goto(fleet.url + "/ui/nodes?state=Ready")
    assert tab.page.locator("#node-count").inner_text().startswith("1 of 1")
    assert tab.problems == []


def _chat_once(tab: Watched, fleet: Cluster) -> None:
    """One chat with sim-a from the console's chat page, waited for to its end."""
    tab.page.goto(fleet.url + "/ui/chat")
    tab.page.get_by_label("Model").select_option("sim-a")
    tab.page.get_by_label("Message").fill("hello console")
    tab.page.get_by_role("button", name="Send").click()
    tab.page.wait_for_selector(".msg-assistant[data-done='1']", timeout=30_000)


def test_chat_streams_from_a_sim_model_and_shows_the_decision(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.key)
    _chat_once(tab, fleet)
    answer = tab.page.locator(".msg-assistant .msg-text").inner_text()
    assert answer.strip(), "the sim model's tokens reached the page"
    tab.page.wait_for_selector("#decision", timeout=30_000)
    decision = tab.page.locator("#decision").inner_text()
    assert "Endpoint" in decision and "none picked" not in decision
    shot(tab, "tenant-chat")
    assert axe_serious(tab) == []
    assert tab.problems == []


def test_tenant_sees_only_its_project(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.key)
    assert tab.page.url.endswith("/ui/tenants")
    body = tab.page.locator("main").inner_text()
    assert "playground" in body and "other-project" not in body and "Project other" not in body
    assert tab.page.get_by_role("link", name="Nodes").count() == 0
    # Its own request, so the chart has usage whatever ran before (alone, or on another xdist worker).
    _chat_once(tab, fleet)

    def usage_of_sim_a_charted() -> bool:
        tab.page.goto(fleet.url + "/ui/tenants")
        tab.page.get_by_label("per hour, by").select_option("model")
        tab.page.get_by_label("Chart", exact=True).select_option("tokens")
        return "sim-a" in tab.page.locator("#usage-chart .u-legend").inner_text()

    wait_until(usage_of_sim_a_charted, 30, "the chat's usage in the tenant's chart", interval=0.5)
    assert tab.page.locator("#chart-caption").inner_text().startswith("Tokens per hour by model")
    assert tab.page.locator("#usage-chart canvas").count() == 1
    shot(tab, "tenant-usage")
    response = tab.page.goto(fleet.url + "/ui/nodes")
    assert response is not None and response.status == 403
    tab.page.goto(fleet.url + "/ui/chat")
    options = tab.page.locator("#chat-model option").all_inner_texts()
    assert options == ["sim-a", "sim-b"]  # playground's "sim-*"


def _post(url: str, data: bytes, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_csrf_less_posts_and_expired_sessions_are_refused(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.admin_token)
    cookie = next(c for c in tab.context.cookies() if c["name"] == "llmgw_console")
    headers = {
        "Cookie": f"llmgw_console={cookie['value']}",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    url = f"{fleet.url}/ui/keys/{fleet.key_id}/revoke"
    assert _post(url, b"", headers) == 403
    assert _post(url, b"csrf=wrong", headers) == 403
    chat = {"Cookie": headers["Cookie"], "Content-Type": "application/json"}
    assert _post(fleet.url + "/ui/chat/send", json.dumps({"model": "sim-a"}).encode(), chat) == 403
    assert _post(fleet.url + "/ui/login", b"token=" + fleet.admin_token.encode(), headers) == 403
    keys = fleet.loop.run(fleet.running.controller.store.list_keys("playground"))
    assert all(k.revoked_at is None for k in keys), "no refused POST revoked anything"
    session = fleet.running.console.sessions.by_id[cookie["value"]]
    session.expires_at = fleet.running.controller.wall() - 1  # the controller's clock says it is over
    tab.page.goto(fleet.url + "/ui/nodes")
    assert tab.page.url.endswith("/ui/login?expired=1")
    assert tab.page.get_by_role("alert").inner_text().startswith("Your session expired")
    assert cookie["value"] not in fleet.running.console.sessions.by_id


def test_a_key_revoked_in_the_console_is_refused_by_the_router(fleet: Cluster, tab: Watched) -> None:
    from llmgw.adapters import keys as keymod

    ctl = fleet.running.controller
    doomed = fleet.loop.run(keymod.create_key(ctl.store, "playground", ctl.wall(), name="doomed"))

    def chat_status() -> int:
        body = json.dumps({"model": "sim-a", "messages": [{"role": "user", "content": "hi"}]}).encode()
        headers = {"Authorization": f"Bearer {doomed.plaintext}", "Content-Type": "application/json"}
        return _post(fleet.router.base_url + "/chat/completions", body, headers)

    assert chat_status() == 200
    tenant = Watched(tab.page.context.browser)
    login(tenant, fleet.url, doomed.plaintext)
    assert tenant.page.url.endswith("/ui/tenants")
    login(tab, fleet.url, fleet.admin_token)
    tab.page.goto(fleet.url + "/ui/tenants")
    tab.page.get_by_role("button", name=f"Revoke key {doomed.key.id}").click()
    tab.page.wait_for_url(re.compile(r".*/ui/tenants#keys$"))
    row = tab.page.locator("#keys tr", has_text=doomed.key.id)
    assert "revoked" in row.inner_text()
    wait_until(lambda: chat_status() == 401, 30, "the router refusing the revoked key")
    assert tab.problems == []
    sid = next(c["value"] for c in tenant.context.cookies() if c["name"] == "llmgw_console")
    fleet.running.console.sessions.by_id[sid].key_checked_at -= 60  # its key is due to be looked up again
    tenant.page.goto(fleet.url + "/ui/tenants")
    assert tenant.page.url.endswith("/ui/login?expired=1"), "a session of a revoked key ends"
    tenant.close()


def test_events_update_live_and_the_page_is_keyboard_navigable(fleet: Cluster, tab: Watched) -> None:
    login(tab, fleet.url, fleet.admin_token)
    tab.page.goto(fleet.url + "/ui/events")
    ctl = fleet.running.controller
    fleet.loop.run(ctl.event("console_check", "probe", "a marker the page was not loaded with"))
    tab.page.wait_for_selector("text=a marker the page was not loaded with", timeout=15_000)  # no reload
    tab.page.keyboard.press("Tab")
    assert tab.page.evaluate("document.activeElement.textContent") == "Skip to content"
    tab.page.keyboard.press("Tab")
    assert tab.page.evaluate("document.activeElement.textContent") == "Overview"
    tab.page.keyboard.press("Enter")
    tab.page.wait_for_url(re.compile(r".*/ui/$"))
    assert tab.problems == []


def test_keys_show_their_last_use(fleet: Cluster, tab: Watched) -> None:
    from llmgw.adapters import keys as keymod

    ctl = fleet.running.controller
    used = fleet.loop.run(keymod.create_key(ctl.store, "playground", ctl.wall(), name="used"))
    idle = fleet.loop.run(keymod.create_key(ctl.store, "playground", ctl.wall(), name="idle"))
    body = json.dumps({"model": "sim-a", "messages": [{"role": "user", "content": "hi"}]}).encode()
    headers = {"Authorization": f"Bearer {used.plaintext}", "Content-Type": "application/json"}
    assert _post(fleet.router.base_url + "/chat/completions", body, headers) == 200
    login(tab, fleet.url, fleet.admin_token)
    tab.page.goto(fleet.url + "/ui/tenants")
    column = tab.page.locator("#keys th").all_inner_texts().index("Last used")

    def last_used(key_id: str) -> str:
        row = tab.page.locator("#keys tbody tr", has_text=key_id)
        return str(row.locator("td").nth(column).inner_text())

    def shown() -> bool:  # the router writes usage in batches: the row arrives within its flush interval
        tab.page.goto(fleet.url + "/ui/tenants")
        return last_used(used.key.id).endswith("ago")

    wait_until(shown, 30, "the used key's last use on the tenants page")
    assert re.fullmatch(r"\d+s ago", last_used(used.key.id))
    assert last_used(idle.key.id) == "never"
    assert tab.problems == []


def test_a_replica_page_shows_its_engine_metrics_as_the_routers_scrape_them(
    fleet: Cluster, tab: Watched
) -> None:
    ctl = fleet.running.controller
    replica = next(r.id for r in ctl.replicas.values() if r.model == "sim-a")
    login(tab, fleet.url, fleet.admin_token)

    def row() -> list[str] | None:
        tab.page.goto(f"{fleet.url}/ui/replicas/{replica}")
        table = tab.page.locator("table", has_text="As each router last reported it")
        if table.count() == 0:
            return None
        cells = [str(t) for t in table.locator("tbody tr").first.locator("td").all_inner_texts()]
        return cells if cells[-1].endswith("%") else None  # scraped: the sim publishes its KV cache use

    cells = wait_until(
        row, 30, "a router's load report with the replica's scraped engine metrics", interval=0.5
    )
    router, _age, inflight, requests, errors, _ttft, running, waiting, kv = cells
    assert router in ctl.worker_state.loads
    assert all(v.isdigit() for v in (inflight, requests, errors, running, waiting))
    assert 0 <= float(kv.rstrip(" %")) <= 100
    assert tab.problems == []


def _candidate(name: str, cost: float, share: float | None, *, chosen: bool = False) -> dict[str, Any]:
    met = share is None or share <= 1
    return {
        "name": name,
        "configuration": f"chat: {name} x 2",
        "chosen": chosen,
        "cost_per_hour": cost,
        "ttft_p99_ms": None if share is None else 800 * share,
        "ttft_share": share,
        "tpot_p99_ms": 30.0,
        "availability": 1.0,
        "met": met,
        "missed": [] if met else [f"chat (web) ttft_p99_ms {800 * (share or 0):.0f}"],
    }


SUGGESTION = {
    "revision": "c0ffee0c0ffee0c0ffee",
    "objective": "cost",
    "currency": "USD",
    "busiest_hour": 9,
    "found": True,
    "method": "exhaustive: 72 configurations, 72 weighed",
    "replay": "trace day.jsonl; hour 9, 21600 requests, seed 0",
    "candidates": [
        _candidate("suggested", 5.6, 0.7, chosen=True),
        _candidate("runner-up 1", 9.0, 0.4),
        _candidate("runner-up 2", 4.8, 1.3),
        _candidate("runner-up 3", 7.0, None),
    ],
    "text": "\nSuggested fleet (objective cost):\n  chat: l4 (l4-24g) x 1..7\n",
}


def test_the_plan_page_draws_the_posted_suggestion_with_its_table(fleet: Cluster, tab: Watched) -> None:
    headers = {"Authorization": f"Bearer {fleet.admin_token}", "Content-Type": "application/json"}
    url = fleet.url + "/api/v1/suggestions"
    assert _post(url, json.dumps({**SUGGESTION, "objective": "speed"}).encode(), headers) == 400
    assert _post(url, json.dumps(SUGGESTION).encode(), headers) == 200
    login(tab, fleet.url, fleet.admin_token)
    tab.page.goto(fleet.url + "/ui/plan")
    figure = tab.page.get_by_role("img", name="Candidates: cost per hour against p99 TTFT (replay)")
    assert figure.count() == 1
    points = tab.page.locator("#suggest-chart g.candidate")
    assert points.count() == 3, "one point per candidate with a TTFT objective"
    assert "runner-up 3" in tab.page.locator("figcaption").inner_text(), "the undrawn one is named"
    chosen = tab.page.locator("#suggest-chart g.candidate.chosen")
    assert chosen.count() == 1 and chosen.get_attribute("data-name") == "suggested"
    assert "suggested" in (chosen.text_content() or "")
    slo = float(tab.page.locator("#suggest-slo").get_attribute("y1") or "nan")
    ys = {
        points.nth(i).get_attribute("data-name"): float(
            points.nth(i).locator("circle").last.get_attribute("cy") or "nan"
        )
        for i in range(3)
    }
    assert ys["runner-up 2"] < slo < ys["suggested"] < ys["runner-up 1"], (
        "above the line: missed (SVG y is down)"
    )
    xs = [float(points.nth(i).locator("circle").last.get_attribute("cx") or "nan") for i in range(3)]
    assert xs[2] < xs[0] < xs[1], "x follows the cost per hour"
    rows = tab.page.locator("#suggest-table tbody tr")
    assert rows.count() == 4
    first = rows.first.inner_text()
    assert first.startswith("suggested") and "5.60" in first and "70 %" in first and "met" in first
    assert "missed: chat (web) ttft_p99_ms 1040" in rows.nth(2).inner_text()
    assert "no objective" in rows.nth(3).inner_text()
    assert axe_serious(tab) == []
    shot(tab, "admin-plan-suggested")
    assert tab.problems == []
