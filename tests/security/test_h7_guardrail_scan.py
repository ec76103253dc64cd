"""H7 (issue 35): a guardrail's scan of a tenant's prompt never holds a router's event loop.

* The exploit as the review sketches it: a 400 KB prompt (`"a" * 400_000 + "@"`, a long run of local-part
  characters before one `@`) under `pii: [email]`. The quadratic e-mail pattern froze the router for minutes;
  now it is answered (or refused) and, meanwhile, the same router keeps answering other requests. The probes
  run in a child process: a frozen router holds the GIL, so a thread of this process could not tell.
* The e-mail matcher is linear and finds what the old pattern found.
* A text longer than what a guardrail scans is a finding (`max_scan_chars`), never a tail passed unscanned.
* A repo regex that backtracks is searched with a deadline (a `regex[N].deadline` finding), and `validate`
  refuses nested quantifiers where they are written, saying what would be right.
* A short prompt is scanned on the loop only when every repo regex tries a bounded number of ways at each
  position (a literal, a class, a fixed count); under any other regex, or when longer, in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from llmgw_router.app import Listeners, serve
from llmgw_router.path.auth import Authenticator, StaticKeys
from llmgw_router.path.guard import scan_off_loop
from llmgw_router.path.service import Router, RouterOptions
from router.helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

from llmgw.adapters.keys import hash_key
from llmgw.controller.wire.publisher import published_models
from llmgw.core.config.checks.regex_checks import bounded_work
from llmgw.core.config.specs.guardrail_spec import GuardrailSpec
from llmgw.core.desired.repo import validate_files
from llmgw.core.evals import guardrails as gr
from llmgw.core.snapshot import RouterSnapshot

KEY = "sk-llmgw-" + "h" * 43
DOCS = """
apiVersion: llmgw/v1
kind: Organization
metadata: {name: org}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: tenant}
spec: {organization: org}
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-chat}
spec: {context_length: 4096, capabilities: [chat, completions], profiles: [{name: sim, engine: sim}]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: pii}
spec:
  pii: [email]
  attach: {projects: [tenant]}
"""

# The child: one thread sends the 400 KB prompt; once it is on the wire, small chats are sent one after
# another until its answer is in, each within the suite's request deadline. Prints what each got.
PROBE = textwrap.dedent(
    """
    import http.client, json, sys, threading
    port, key = int(sys.argv[1]), sys.argv[2]
    def chat(text, deadline):
        body = json.dumps({"model": "sim-chat", "max_tokens": 4,
                           "messages": [{"role": "user", "content": text}]}).encode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=deadline)
        conn.request("POST", "/v1/chat/completions", body,
                     {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
        sent.set()
        try:
            return conn.getresponse().status
        except TimeoutError:
            return "timeout"
    sent, out = threading.Event(), {"probes": []}
    big = threading.Thread(target=lambda: out.update(big=chat("a" * 400_000 + "@", 120)))
    big.start()
    sent.wait()
    while True:
        out["probes"].append(chat("hello", 30))
        if not big.is_alive() or out["probes"][-1] == "timeout":
            break
    big.join()
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "k-h7")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


@pytest.fixture
async def router_url(sim: SimProcess) -> AsyncIterator[str]:
    result = validate_files({"docs.yaml": DOCS.encode()})
    assert result.repo is not None, [str(e) for e in result.errors]
    cat = result.repo.catalog
    snap = RouterSnapshot.model_validate(
        {
            "revision": "h7",
            "models": {n: m.model_dump() for n, m in published_models(cat).items()},
            "tenants": cat.tenants().model_dump(),
            "guard": cat.published_guard().model_dump(),
            "endpoints": [endpoint(sim, "chat-1")],
        }
    )
    keys = StaticKeys.from_file_lines([f"{hash_key(KEY)} tenant key-1"])
    router = Router(RouterOptions(router_id="h7"), Authenticator(keys))
    router.apply_snapshot(snap)
    listeners: Listeners = await serve(router, "127.0.0.1:0", "127.0.0.1:0")
    try:
        yield f"{listeners.api_port}"
    finally:
        await listeners.close()


async def test_a_400kb_prompt_under_an_email_guardrail_leaves_the_router_answering(router_url: str) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PROBE, router_url, KEY, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    got: dict[str, Any] = json.loads(out)
    assert got["probes"] and all(status == 200 for status in got["probes"]), got
    assert got["big"] in (200, 400), got  # answered, or refused as longer than the model's context


# ------------------------------------------------------------------------------------------ the matcher

_OLD_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


@pytest.mark.parametrize(
    "text",
    [
        "mail me at a.b@example.com.",
        "x@y.co-uk and joe@example.com-foo",
        "a@b.c a@@b.cc a@b..cc a@.b.cc",
        "first@one.org,second@two.io;third@sub.three.net",
        "j@1.2.museum",
    ],
)
def test_the_linear_matcher_finds_what_the_pattern_found(text: str) -> None:
    assert gr._email_spans(text) == [m.span() for m in _OLD_EMAIL.finditer(text)]


def test_the_quadratic_shapes_are_scanned_in_one_pass() -> None:
    g = gr.compile_guardrail("pii", GuardrailSpec(pii=["email"]))
    for text in ("a" * 400_000 + "@", "x@" + "a-" * 200_000, "a@" * 200_000):
        assert gr.scan(g, text, "input") == []
    assert gr.scan(g, "a" * 400_000 + "@example.com", "input") == [gr.Finding("pii", "pii.email", True)]


def test_past_the_scan_limit_is_a_finding_not_an_unscanned_tail() -> None:
    g = gr.compile_guardrail("pii", GuardrailSpec(pii=["email"]))
    hidden = "x" * gr.MAX_SCAN_CHARS + " joe@example.com"
    assert [f.rule for f in gr.scan(g, hidden, "input")] == ["max_scan_chars"]
    assert [f.rule for f in gr.scan(g, hidden, "output")] == ["max_scan_chars"]
    capped = gr.compile_guardrail("pii", GuardrailSpec(pii=["email"], max_prompt_chars=100))
    assert [f.rule for f in gr.scan(capped, "x" * 200 + " joe@example.com", "input")] == ["max_prompt_chars"]
    assert gr.decide([g], gr.scan(g, hidden, "input"), "input").action == "block"


def test_a_backtracking_repo_regex_stops_at_its_deadline() -> None:
    # Compiled as the router does, past validate (a snapshot published before this check existed).
    g = gr.compile_guardrail("words", GuardrailSpec(regex=[r"(a|aa)+$"]))
    finding = gr.Finding("words", "regex[0].deadline")
    assert gr.scan(g, "a" * 5_000 + "!", "input") == [finding]  # `re` would try ~fib(5000) splits
    assert gr.decide([g], [finding], "input").action == "block"
    assert (
        gr.redact(g, "a" * 5_000 + "!") == "[REDACTED]"
    )  # what cannot be redacted in time is redacted whole


@pytest.mark.parametrize(
    ("pattern", "what"),
    [
        (r"(a+)+$", "a variable repetition (`+`) inside a repetition (`+`)"),
        (r"^(\w+\s?)*$", "a variable repetition (`+`) inside a repetition (`*`)"),
        (r"(a|ab)+c", "an alternation whose branches may begin alike, inside a repetition (`+`)"),
    ],
)
def test_validate_refuses_a_pattern_that_backtracks_where_it_is_written(pattern: str, what: str) -> None:
    doc = DOCS.replace("  pii: [email]\n", f"  pii: [email]\n  regex: ['{pattern}']\n")
    result = validate_files({"docs.yaml": doc.encode()})
    messages = [str(e) for e in result.errors]
    line = doc.splitlines().index(f"  regex: ['{pattern}']") + 1
    assert any(
        m.startswith(f"docs.yaml:{line}:") and "spec.regex[0]" in m and what in m and "possessive" in m
        for m in messages
    ), messages


def test_validate_accepts_the_possessive_and_atomic_forms() -> None:
    for pattern in (r"(?>\w+\s?)+$", r"[\w\s]+$", r"sk-[A-Za-z0-9]{20,}", r"(?:foo|bar)+"):
        doc = DOCS.replace("  pii: [email]\n", f"  pii: [email]\n  regex: ['{pattern}']\n")
        result = validate_files({"docs.yaml": doc.encode()})
        assert result.repo is not None, [str(e) for e in result.errors]


@pytest.mark.parametrize(
    ("pattern", "bounded"),
    [
        (r"(?i)secret[-_ ]key", True),
        (r"\bAKIA[0-9A-Z]{16}\b", True),
        (r"(?:ab|cd){2}(?=!)", True),
        (r"\d{3}-?\d{4}", True),
        (r"a+", False),  # open repetitions: the ways at one position grow with the text
        (r"sk-[A-Za-z0-9]{20,}", False),
        (r"(a)\1", False),  # a backreference
        (r"x{0,200}", False),  # more than MAX_WAYS ways
        (r"(?:foo){e<=1}", False),  # fuzzy matching to the `regex` module, literals to `re`'s parser
        (r"\p{L}", False),  # what `re`'s parser cannot read
    ],
)
def test_a_pattern_of_bounded_work_is_told_from_one_that_may_backtrack(pattern: str, bounded: bool) -> None:
    assert bounded_work(pattern) is bounded


class _CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.jobs = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.jobs += 1
        return super().submit(*args, **kwargs)


def _scan_in(pattern: str, text: str) -> tuple[list[str], int]:
    """The rules `scan_off_loop` finds for one repo regex over `text`, and how many jobs went to a thread."""
    g = gr.compile_guardrail("words", GuardrailSpec(regex=[pattern]))

    async def scan() -> list[gr.Finding]:
        return await scan_off_loop([g], text, "input", [])

    executor = _CountingExecutor()
    loop = asyncio.new_event_loop()
    try:
        loop.set_default_executor(executor)
        found = loop.run_until_complete(scan())
    finally:
        loop.close()
        executor.shutdown()
    return [f.rule for f in found], executor.jobs


def test_a_short_prompt_under_a_bounded_regex_is_scanned_on_the_loop_and_others_in_a_thread() -> None:
    assert _scan_in(r"(?i)secret[-_ ]key", "my Secret-Key is here") == (["regex[0]"], 0)
    assert _scan_in(r"(?i)secret[-_ ]key", "nothing to see") == ([], 0)
    assert _scan_in(r"sk-[a-z]{20,}", "sk-" + "a" * 20) == (["regex[0]"], 1)
    # However bounded the regex, a long text is scanned in the worker thread, under the scan's deadline.
    assert _scan_in(r"(?i)secret[-_ ]key", "x" * 9_000 + " secret key") == (["regex[0]"], 1)
