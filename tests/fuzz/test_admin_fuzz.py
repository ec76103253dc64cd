"""Bad input at the controller's admin API, as a real process: every endpoint, without and with the token,
gets malformed JSON, wrong types, huge and invalid UTF-8 bodies, odd query strings and path segments, header
values with CR/LF and slow clients. Each answer is a JSON error with a 4xx (never a 500, never a traceback),
the process stays up and its open descriptors come back."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from controller.helpers import Repo, cluster_yaml, model_yaml
from faults.procs import (
    ControllerProc,
    body_of,
    open_fds,
    raw_request,
    start_controller_proc,
    status_of,
)
from hypothesis import HealthCheck, example, given, settings, strategies as st
from support import wait_until

pytestmark = pytest.mark.integration

TOKEN = "admin-fuzz-token"
GETS = (
    "/api/v1/status",
    "/api/v1/nodes",
    "/api/v1/replicas",
    "/api/v1/models",
    "/api/v1/explain/sim-a",
    "/api/v1/state",
    "/api/v1/events",
)
POSTS = ("/api/v1/apply", "/api/v1/demand/sim-a", "/api/v1/usage-seen")
FD_TOLERANCE = 8
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture], database=None
)


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerProc]:
    tmp = tmp_path_factory.mktemp("admin-fuzz")
    repo = Repo(tmp / "repo", use_git=False)
    repo.write({"cluster.yaml": cluster_yaml(), "models/a.yaml": model_yaml("sim-a", min_=0)})
    (tmp / "token").write_text(TOKEN + "\n")
    settings = {
        "repo": str(repo.path),
        "source": "directory",
        "dir_poll_s": 0.5,
        "store": f"sqlite:///{tmp / 'c.db'}",
        "admin_token_file": str(tmp / "token"),
        "state_dir": str(tmp / "state"),
        "settle_s": 0,
    }
    c = start_controller_proc(tmp / "controller.log", settings, TOKEN)
    wait_until(lambda: _status_applied(c), 30, "the repo applied")
    yield c
    c.stop()
    log = c.text()
    assert "Traceback" not in log, f"the controller logged a traceback:\n{log[-4000:]}"
    assert TOKEN not in log, "the admin token reached the log"


def _status_applied(c: ControllerProc) -> bool:
    status, body = call(c, "GET", "/api/v1/status")
    return status == 200 and json.loads(body)["applied"] is not None


def call(
    c: ControllerProc, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN
) -> tuple[int, bytes]:
    headers = {"Connection": "close", "Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(c.url + path, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status), r.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def assert_json_error(status: int, body: bytes, allowed: tuple[int, ...]) -> str:
    assert status != 500 and b"Traceback" not in body and b'File "' not in body, (status, body[:400])
    assert status in allowed, (status, body[:300])
    obj = json.loads(body)
    message = obj["error"]["message"]
    assert isinstance(message, str) and message
    return message


def test_every_endpoint_refuses_without_the_token(controller: ControllerProc) -> None:
    for path in GETS:
        for token in (None, "wrong", ""):
            status, body = call(controller, "GET", path, token=token)
            assert "token" in assert_json_error(status, body, (401,))
    for path in POSTS:
        status, body = call(controller, "POST", path, b"{}", token=None)
        assert_json_error(status, body, (401,))
    # The webhook needs no token on purpose: it only triggers a poll, whatever the body says.
    status, body = call(controller, "POST", "/api/v1/webhook", b"\xff\xfe junk", token=None)
    assert status == 202 and json.loads(body)["polling"] is True


def test_the_admin_api_listens_on_loopback_by_default() -> None:
    from llmgw.controller.parts.settings import ControllerOptions

    defaults = ControllerOptions(repo=".", store="x")
    assert defaults.listen_hostport[0] == "127.0.0.1"
    assert defaults.metrics_hostport is not None and defaults.metrics_hostport[0] == "127.0.0.1"


@FUZZ
@given(path=st.sampled_from(POSTS), raw=st.binary(max_size=2048))
def test_arbitrary_bodies_are_a_clear_4xx(controller: ControllerProc, path: str, raw: bytes) -> None:
    status, body = call(controller, "POST", path, raw)
    if status in (200, 202):
        json.loads(body)
        return
    assert_json_error(status, body, (400, 404, 413, 422))


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
APPLY = st.fixed_dictionaries(
    {},
    optional={
        "path": JSON | st.sampled_from(["/", "/nonexistent", "../../etc", ""]),
        "files": JSON
        | st.dictionaries(
            st.sampled_from(["a.yaml", "../x.yaml", "/abs.yaml", "m/b.yaml", ""]), JSON, max_size=3
        ),
        "revision": JSON,
        "source": JSON,
        "force": JSON,
        "models": JSON,
    },
)


@FUZZ
@given(path=st.sampled_from(POSTS), doc=APPLY | JSON)
@example(path="/api/v1/apply", doc={"files": {"a.yaml": "kind: [unclosed"}})  # a refused revision: 422
def test_wrong_types_never_500(controller: ControllerProc, path: str, doc: Any) -> None:
    status, body = call(controller, "POST", path, json.dumps(doc).encode())
    if status in (200, 202):
        return
    assert_json_error(status, body, (400, 403, 404, 413, 422))


@FUZZ
@given(
    segment=st.text(min_size=1, max_size=30),
    query=st.dictionaries(
        st.sampled_from(["limit", "model", "since", "x"]), st.text(max_size=12), max_size=3
    ),
)
def test_odd_paths_and_queries(controller: ControllerProc, segment: str, query: dict[str, str]) -> None:
    quoted = urllib.parse.quote(segment, safe="")
    qs = urllib.parse.urlencode(query)
    for path in (f"/api/v1/explain/{quoted}", f"/api/v1/events?{qs}", f"/api/v1/replicas?{qs}"):
        status, body = call(controller, "GET", path)
        if status == 200:
            json.loads(body)
            continue
        assert_json_error(status, body, (400, 404))


def test_huge_and_invalid_utf8_bodies(controller: ControllerProc) -> None:
    before = open_fds(controller.pid)
    status, body = call(
        controller, "POST", "/api/v1/apply", b'{"files": {"a.yaml": "' + b"x" * (40 << 20) + b'"}}'
    )
    assert_json_error(status, body, (413,))
    status, body = call(controller, "POST", "/api/v1/usage-seen", b'{"models": ["\xff\xfe"]}')
    assert_json_error(status, body, (400,))
    status, body = call(controller, "POST", "/api/v1/apply", b'{"files": {"a.yaml": "\xc3\x28"}}')
    assert_json_error(status, body, (400,))
    wait_until(lambda: open_fds(controller.pid) <= before + FD_TOLERANCE, 15, "fds back")


HEADER_VALUES = st.sampled_from(
    [b"Bearer a\rb", b"Bearer " + TOKEN.encode() + b"\nX-Evil: 1", b"\r", b"x\n", b"a\x00b"]
) | st.binary(min_size=1, max_size=40).map(lambda b: b"Bearer " + b + b"\r")


@FUZZ
@given(value=HEADER_VALUES, path=st.sampled_from(GETS))
def test_header_values_with_cr_lf(controller: ControllerProc, value: bytes, path: str) -> None:
    port = int(controller.url.rsplit(":", 1)[1])
    request = (
        b"GET "
        + path.encode()
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: "
        + value
        + b"\r\nConnection: close\r\n\r\n"
    )
    reply = raw_request(port, request)
    if not reply:
        return
    status = status_of(reply)
    assert status in (400, 401) and b"Traceback" not in reply, reply[:400]
    assert controller.alive()


def test_slow_and_abandoned_clients(controller: ControllerProc) -> None:
    port = int(controller.url.rsplit(":", 1)[1])
    before = open_fds(controller.pid)
    body = json.dumps({"models": ["sim-a"]}).encode()
    request = (
        b"POST /api/v1/usage-seen HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
        % len(body)
        + body
    )
    reply = raw_request(port, request, pace=0.005, timeout=30)
    assert status_of(reply) == 200 and json.loads(body_of(reply))["known"] == 1
    for _ in range(10):
        raw_request(port, request[: len(request) - 5], timeout=0.2)
    wait_until(
        lambda: open_fds(controller.pid) <= before + FD_TOLERANCE, 20, "fds back after abandoned clients"
    )
    assert controller.alive()


def test_agent_and_router_streams_refuse_without_a_token(controller: ControllerProc) -> None:
    """The two WebSocket endpoints: no token, no stream (agents get the protocol's refusal message)."""
    import asyncio

    import aiohttp

    async def run() -> None:
        async with aiohttp.ClientSession() as s:
            async with s.ws_connect(controller.url + "/agent/v1") as ws:
                msg = await ws.receive(timeout=10)
                refused = json.loads(msg.data)
                assert refused["type"] == "refused" and "Authorization" in refused["reason"]
            async with s.ws_connect(
                controller.url + "/agent/v1", headers={"Authorization": "Bearer wrong"}
            ) as ws:
                msg = await ws.receive(timeout=10)
                assert json.loads(msg.data)["reason"] == "wrong token"
            with pytest.raises(aiohttp.WSServerHandshakeError) as caught:
                async with s.ws_connect(controller.url + "/router/v1"):
                    pass
            assert caught.value.status == 401

    asyncio.run(run())


def test_no_descriptor_leak_over_the_module(controller: ControllerProc) -> None:
    wait_until(lambda: open_fds(controller.pid) <= 40, 20, "controller fds under 40")
    assert controller.alive()
