"""Bad input at the router, as a real process: every public endpoint gets malformed JSON, wrong types, huge
bodies, invalid UTF-8, slow clients and header values with CR/LF. Each answer is a clear 4xx in OpenAI's
error shape (never a 500, never a traceback), the process stays up and its open descriptors come back.

Engine answers the router parses (a truncated JSON body, HTML where JSON belongs, a stream that is not SSE,
an HTML metrics page) come from a fake engine: the client gets a 502 in OpenAI's shape and the router keeps
serving the model next door.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from faults.procs import (
    FakeEngine,
    RouterProc,
    body_of,
    open_fds,
    raw_request,
    start_router_proc,
    status_of,
)
from hypothesis import HealthCheck, given, settings, strategies as st
from router.helpers import SimProcess, start_sim, wait_healthy_sync
from support import wait_until

from llmgw.adapters.keys import hash_key

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "f" * 43
MAX_BODY = 64 * 1024
POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
GETS = ("/v1/models", "/health", "/ready")
FD_TOLERANCE = 8
BROKEN_CASES = ("truncated-json", "html-200", "html-500", "stream-not-sse", "stream-cut")
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None
)


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngine]:
    fake = FakeEngine().start()
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    s = start_sim("sim-chat", "engine-key")
    try:
        wait_healthy_sync([s])
        yield s
    finally:
        s.kill()


@pytest.fixture(scope="module")
def router(
    tmp_path_factory: pytest.TempPathFactory, sim: SimProcess, engine: FakeEngine
) -> Iterator[RouterProc]:
    tmp = tmp_path_factory.mktemp("router-fuzz")
    snapshot = {
        "revision": "fuzz-1",
        "router": {"max_body_bytes": MAX_BODY},
        "models": {
            "sim-chat": {"context_length": 4096, "capabilities": ["chat", "completions", "embeddings"]},
            **{f"broken-{case}": {"context_length": 4096} for case in BROKEN_CASES},
        },
        "endpoints": [
            {
                "replica_id": "sim-1",
                "model": "sim-chat",
                "engine": "sim",
                "base_url": sim.base_url,
                "api_key": sim.key,
                "slots": 8,
            },
            *(
                {
                    "replica_id": f"broken-{case}-{i}",
                    "model": f"broken-{case}",
                    "engine": "vllm",
                    "base_url": engine.base_url,
                    "api_key": "fake-key",
                    "slots": 8,
                }
                for case in BROKEN_CASES
                for i in (1, 2)  # two, so the router's one retry also meets a broken answer: 502
            ),
        ],
    }
    (tmp / "snapshot.json").write_text(json.dumps(snapshot))
    (tmp / "keys").write_text(f"{hash_key(KEY)} p1 key-1\n")
    r = start_router_proc(
        tmp / "router.log",
        ["--snapshot", str(tmp / "snapshot.json"), "--keys-file", str(tmp / "keys"), "--router-id", "fuzz"],
    )
    yield r
    r.stop()
    log = r.text()
    assert "Traceback" not in log, f"the router logged a traceback:\n{log[-4000:]}"
    assert KEY not in log and "fake-key" not in log and sim.key not in log, "a key reached the log"


def post(
    router: RouterProc, path: str, body: bytes, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    hdrs = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", "Connection": "close"}
    hdrs.update(headers or {})
    req = urllib.request.Request(router.api + path, data=body, headers=hdrs, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def assert_openai_error(status: int, body: bytes, *, allowed: tuple[int, ...] = ()) -> dict[str, Any]:
    assert status != 500, f"500 from the router: {body[:300]!r}"
    assert b"Traceback" not in body and b'File "' not in body, body[:500]
    obj = json.loads(body)
    assert isinstance(obj, dict) and isinstance(obj.get("error"), dict), body[:300]
    err = obj["error"]
    assert isinstance(err.get("message"), str) and err["message"], err
    assert "type" in err and "code" in err, err
    if allowed:
        assert status in allowed, (status, err)
    return err


def fds_settle(router: RouterProc, before: int) -> None:
    wait_until(lambda: open_fds(router.pid) <= before + FD_TOLERANCE, 15, f"router fds back near {before}")


def test_fds_baseline_and_valid_request(router: RouterProc) -> None:
    status, body = post(router, "/v1/completions", json.dumps({"model": "sim-chat", "prompt": "hi"}).encode())
    assert status == 200 and json.loads(body)["choices"], body[:300]


@FUZZ
@given(path=st.sampled_from(POSTS), raw=st.binary(max_size=2048))
def test_arbitrary_bytes_get_a_clear_4xx(router: RouterProc, path: str, raw: bytes) -> None:
    status, body = post(router, path, raw)
    if status == 200:  # hypothesis found a valid request; fine, but it must be a real answer
        json.loads(body)
        return
    assert_openai_error(status, body, allowed=(400, 404, 413))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["sim-chat", "nope", ""]) | JSON,
        "messages": JSON,
        "prompt": JSON,
        "input": JSON,
        "max_tokens": JSON,
        "stream": JSON,
        "stream_options": JSON,
        "temperature": JSON,
    },
)


@FUZZ
@given(path=st.sampled_from(POSTS), doc=FIELDS | JSON)
def test_wrong_types_never_500(router: RouterProc, path: str, doc: Any) -> None:
    status, body = post(router, path, json.dumps(doc).encode())
    if status == 200:
        return  # a valid request (or a stream): answered
    assert_openai_error(status, body, allowed=(400, 404, 413, 422))


@FUZZ
@given(
    path=st.sampled_from(POSTS),
    junk=st.binary(min_size=1, max_size=64).filter(lambda b: _invalid_utf8(b)),
)
def test_invalid_utf8_is_a_400(router: RouterProc, path: str, junk: bytes) -> None:
    raw = b'{"model": "sim-chat", "prompt": "' + junk + b'"}'
    status, body = post(router, path, raw)
    err = assert_openai_error(status, body, allowed=(400,))
    assert err["code"] == "invalid_json"


def _invalid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_huge_bodies_are_413_with_or_without_length(router: RouterProc) -> None:
    before = open_fds(router.pid)
    big = b'{"model": "sim-chat", "prompt": "' + b"x" * (4 * 1024 * 1024) + b'"}'
    status, body = post(router, "/v1/completions", big)
    assert_openai_error(status, body, allowed=(413,))
    # Chunked, so the router cannot refuse on the header alone.
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\n\r\n"
    )
    chunk = b"x" * 32768
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(4)) + b"0\r\n\r\n"
    reply = raw_request(int(router.api.rsplit(":", 1)[1]), head + chunks)
    assert status_of(reply) == 413, reply[:300]
    assert json.loads(body_of(reply))["error"]["code"] == "request_too_large"
    fds_settle(router, before)


@pytest.mark.parametrize("path", GETS)
def test_get_pages_answer_json_and_refuse_other_methods(router: RouterProc, path: str) -> None:
    req = urllib.request.Request(
        router.api + path, headers={"Authorization": f"Bearer {KEY}", "Connection": "close"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200 and isinstance(json.loads(r.read()), dict)
    status, body = post(router, path, b"{}")
    assert status == 405 and b"Traceback" not in body


def test_models_without_or_with_a_wrong_key_is_401(router: RouterProc) -> None:
    for auth in (None, "Bearer sk-llmgw-" + "0" * 43, "Basic Zm9vOmJhcg==", "Bearer"):
        headers = {"Connection": "close"} | ({"Authorization": auth} if auth else {})
        req = urllib.request.Request(router.api + "/v1/models", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req, timeout=10)
        assert_openai_error(caught.value.code, caught.value.read(), allowed=(401,))


HEADER_VALUES = st.sampled_from(
    [b"Bearer a\rb", b"Bearer a\nX-Evil: 1", b"Bearer \r\n\r\nGET / HTTP/1.1", b"a\x00b", b"\r", b"x\n"]
) | st.binary(min_size=1, max_size=40).map(lambda b: b"Bearer " + b + b"\r")


@FUZZ
@given(value=HEADER_VALUES, path=st.sampled_from(POSTS + GETS))
def test_header_values_with_cr_lf_are_refused_cleanly(router: RouterProc, value: bytes, path: str) -> None:
    method = b"POST" if path in POSTS else b"GET"
    body = b'{"model": "sim-chat", "prompt": "hi"}'
    request = (
        method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + value + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
        + body
    )
    reply = raw_request(int(router.api.rsplit(":", 1)[1]), request)
    if not reply:
        return  # the server closed the connection: refusing to parse is an answer too
    status = status_of(reply)
    assert status != 500 and b"Traceback" not in reply, reply[:500]
    assert status in (200, 400, 401), reply[:300]  # a split header is then just another header
    assert router.alive()


def test_slow_client_byte_by_byte_is_answered_and_an_abandoned_one_is_let_go(router: RouterProc) -> None:
    port = int(router.api.rsplit(":", 1)[1])
    before = open_fds(router.pid)
    body = json.dumps({"model": "sim-chat", "prompt": "slow", "max_tokens": 2}).encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
        + body
    )
    reply = raw_request(port, request, pace=0.005, timeout=30)
    assert status_of(reply) == 200 and json.loads(body_of(reply))["choices"]
    # Clients that promise a body and go away halfway, several at once.
    for _ in range(10):
        partial = request[: len(request) - len(body) // 2]
        raw_request(port, partial, timeout=0.2)
    status, _ = post(router, "/v1/completions", body)
    assert status == 200
    fds_settle(router, before)


# ------------------------------------------------------------------ engine answers the router parses


async def _truncated_json(request: web.Request) -> web.StreamResponse:
    return web.Response(
        status=200, body=b'{"id": "x", "choices": [{"text": "hal', content_type="application/json"
    )


async def _html_200(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, text="<html><body>Bad Gateway</body></html>", content_type="text/html")


async def _html_500(request: web.Request) -> web.StreamResponse:
    return web.Response(status=500, text="<html>Internal Server Error</html>", content_type="text/html")


async def _not_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"<html>this is not an event stream</html>\n\n")
    await resp.write_eof()
    return resp


async def _sse_cut(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"id": "1", "choices": [{"index": 0, "delta": {"content": "he"}}]}\n\n')
    await resp.write(b'data: {"id": "1", "choi')
    assert request.transport is not None
    request.transport.close()  # the engine dies mid-event
    return resp


async def _metrics_html(request: web.Request) -> web.StreamResponse:
    return web.Response(status=200, text="<html><h1>metrics</h1></html>", content_type="text/html")


HANDLERS = {
    "truncated-json": _truncated_json,
    "html-200": _html_200,
    "html-500": _html_500,
    "stream-not-sse": _not_sse,
    "stream-cut": _sse_cut,
}


async def _by_model(request: web.Request) -> web.StreamResponse:
    model = (await request.json())["model"]
    result: web.StreamResponse = await HANDLERS[model.removeprefix("broken-")](request)
    return result


@pytest.mark.parametrize("case", ["truncated-json", "html-200", "html-500", "stream-not-sse"])
def test_a_broken_engine_answer_is_a_502_and_the_router_keeps_serving(
    router: RouterProc, engine: FakeEngine, case: str
) -> None:
    engine.behave["/v1/chat/completions"] = _by_model
    engine.behave["/metrics"] = _metrics_html
    model = f"broken-{case}"
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": case.startswith("stream"),
    }
    status, raw = post(router, "/v1/chat/completions", json.dumps(body).encode())
    err = assert_openai_error(status, raw, allowed=(502,))
    assert model in err["message"] and "retried once" in err["message"], err
    ok, answer = post(router, "/v1/completions", json.dumps({"model": "sim-chat", "prompt": "hi"}).encode())
    assert ok == 200 and json.loads(answer)["choices"]
    assert router.alive()


def test_a_stream_cut_mid_event_ends_and_the_router_keeps_serving(
    router: RouterProc, engine: FakeEngine
) -> None:
    engine.behave["/v1/chat/completions"] = _by_model
    body = {"model": "broken-stream-cut", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    status, raw = post(router, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200 and raw.startswith(b"data: "), raw[:200]  # what was sent stays sent; then it ends
    ok, _ = post(router, "/v1/completions", json.dumps({"model": "sim-chat", "prompt": "hi"}).encode())
    assert ok == 200


def test_an_html_metrics_page_counts_as_a_scrape_failure_not_a_crash(
    router: RouterProc, engine: FakeEngine
) -> None:
    engine.behave["/metrics"] = _metrics_html
    wait_until(lambda: engine.requests.count("/metrics") >= 3, 20, "the router to scrape the fake engine")

    def scrape_errors() -> float:
        with urllib.request.urlopen(router.metrics + "/metrics", timeout=10) as r:
            text = r.read().decode()
        lines = [ln for ln in text.splitlines() if ln.startswith("llmgw_router_metrics_contract_violations{")]
        lines += [ln for ln in text.splitlines() if ln.startswith("llmgw_router_scrape_errors_total{")]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if "broken-" in ln)

    assert wait_until(lambda: scrape_errors() > 0, 20, "the HTML page to count as a scrape problem")
    ok, _ = post(router, "/v1/completions", json.dumps({"model": "sim-chat", "prompt": "hi"}).encode())
    assert ok == 200 and router.alive()


def test_no_descriptor_leak_over_the_whole_module(router: RouterProc) -> None:
    """Last in the module: after everything above, the router's descriptors are back near a fresh baseline."""
    baseline = 40  # listeners, the sim and fake engine pools, the log, the loop's own: well under this
    wait_until(lambda: open_fds(router.pid) <= baseline, 20, f"router fds under {baseline}")
    assert router.alive()
