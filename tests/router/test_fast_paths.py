"""The request path's cheaper ways of doing things read and write what the plain ways did (docs/router.md,
"Overhead"): orjson where it is exact, the response head built in one piece, the usage spool's line."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.server.http_exchange import response_head
from llmgw_router.upstream.http1 import UpstreamHttpError, _parse_head
from llmgw_router.upstream.proxy import _parse_answer
from prometheus_client import CollectorRegistry

from llmgw.store.records import UsageRecord
from llmgw.store.usage.usage_spool import decode, encode

BIG = 123456789012345678901234567890  # beyond 64 bits: orjson would read it as a float


def test_an_answer_encoded_again_keeps_its_integers_exact() -> None:
    data = json.dumps({"model": "up", "seed": BIG, "usage": {"prompt_tokens": 3}}).encode()
    exact = _parse_answer(data, exact=True)
    assert exact["seed"] == BIG and isinstance(exact["seed"], int)
    assert json.dumps(exact).encode() == data
    # Read only for its usage (the bytes go on unchanged), orjson's float is harmless; the usage is read.
    assert _parse_answer(data, exact=False)["usage"] == {"prompt_tokens": 3}


@pytest.mark.parametrize(
    "data", [b'{"x": NaN}', b'\xef\xbb\xbf{"x": 1}', '{"x": "\u00e9"}'.encode("utf-16"), b'{"x": "\\ud800"}']
)
def test_what_orjson_refuses_and_json_takes_is_still_taken(data: bytes) -> None:
    for exact in (False, True):
        got = _parse_answer(data, exact)
        assert isinstance(got, dict) and set(got) == {"x"}, data


def test_what_is_not_json_is_none() -> None:
    assert _parse_answer(b"<html>bad gateway</html>", exact=False) is None
    assert _parse_answer(b'{"cut": ', exact=True) is None


def _record(**kw: object) -> UsageRecord:
    base: dict[str, object] = dict(
        time=1764604800.123456, request_id="r1", project="p\u00e9", model="m", status=200, key_id=None
    )
    return UsageRecord(**(base | kw))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rec",
    [
        _record(),
        _record(cost=1e-9, latency_ms=0.1, tokens_in=12, tokens_out=5, fallback_used=True, key_id="k"),
        _record(cost=math.inf),  # a price of .inf: orjson would write null
        _record(tokens_in=BIG),  # beyond orjson's 64 bits
    ],
)
def test_a_spooled_line_reads_back_as_the_record_written(rec: UsageRecord) -> None:
    line = encode(rec)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode(line) == rec


def test_the_head_is_one_piece_and_no_value_splits_it() -> None:
    head = response_head(
        200, {"Content-Type": "application/json", "x-a": "1"}, "Content-Length: 2\r\n", False
    )
    lines = head.decode().split("\r\n")
    assert lines[0] == "HTTP/1.1 200 OK" and lines[1].startswith("Date: ")
    assert lines[2:] == ["Content-Type: application/json", "x-a: 1", "Content-Length: 2", "", ""]
    bad = response_head(400, {"x-llmgw-dropped-fields": "a\r\nSet-Cookie: x\0"}, "", True).decode()
    assert "\r\nSet-Cookie" not in bad and "\0" not in bad
    assert "x-llmgw-dropped-fields: a  Set-Cookie: x \r\n" in bad and bad.endswith(
        "Connection: close\r\n\r\n"
    )


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_what_is_counted_locally_reads_as_prometheus_client_would_have_counted_it() -> None:
    local = RouterMetrics(lambda: None, lambda: 0.0)
    direct = RouterMetrics(lambda: None, lambda: 0.0)
    values = [0.0, 0.004, 0.005, 0.0051, 0.3, 1.0, 299.9, 300.0, 301.0, 1e9]
    for v in values:
        local.observe(local.duration, ("m",), v)
        direct.duration.labels("m").observe(v)
    for _ in range(3):
        local.count(local.requests, ("m", "200", ""))
        direct.requests.labels("m", "200", "").inc()
    local.observe_tokens("m", 12, 5)
    direct.tokens.labels("m", "prompt").inc(12)
    direct.tokens.labels("m", "completion").inc(5)
    assert _samples(local.registry) == _samples(direct.registry)
    # Published once: a second collection adds nothing more, the next requests add to it.
    local.count(local.requests, ("m", "200", ""))
    direct.requests.labels("m", "200", "").inc()
    assert _samples(local.registry) == _samples(direct.registry)
    assert (
        local.registry.get_sample_value(
            "llmgw_router_request_duration_seconds_bucket", {"model": "m", "le": "0.005"}
        )
        == 3
    )


def _parse_head_per_line(head: bytes) -> tuple[int, dict[str, str]]:
    """The engine client's head parser as it was, on bytes line by line: the reference for the new one."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
        raise UpstreamHttpError("status line")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise UpstreamHttpError("header line")
        key = name.strip().lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if parts[0] == b"HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
        headers.setdefault("connection", "close")
    return status, headers


_HEAD_BYTES = st.sampled_from([b" ", b"\t", b"\x0b", b"\x85", b"\xa0", b"a", b"A", b"-", b"1", b":", b"\r\n"])


@settings(max_examples=400, deadline=None)
@given(
    version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2"]),
    status=st.sampled_from([b"200", b" 200", b"2x0", b"+200"]),
    fields=st.lists(st.lists(_HEAD_BYTES, max_size=12).map(b"".join), max_size=6),
)
def test_the_engine_head_parser_reads_what_the_per_line_parser_read(
    version: bytes, status: bytes, fields: list[bytes]
) -> None:
    head = b"\r\n".join([version + b" " + status + b" OK", *fields])
    try:
        expected: object = _parse_head_per_line(head)
    except (UpstreamHttpError, ValueError):
        expected = "refused"
    try:
        got: object = _parse_head(head)
    except UpstreamHttpError:
        got = "refused"
    assert got == expected, head
