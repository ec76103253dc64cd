"""The trace format (llmgw/core/traffic/trace.py): what export writes, import and the replay read back."""

from __future__ import annotations

import pytest

from llmgw.core.traffic.trace import TracedRequest, TraceError, TraceHeader, format_trace, parse_trace


def test_a_trace_reads_back_what_was_written_in_arrival_order() -> None:
    header = TraceHeader(start=1_700_000_000.0, duration_s=60.0, source="test")
    later = TracedRequest(t=2.5, model="m", project="p", prompt_tokens=10, completion_tokens=3, stream=True)
    first = TracedRequest(
        t=0.5,
        model="m",
        project="q",
        prompt_tokens=7,
        completion_tokens=1,
        prefix="ab12",
        ttft_ms=None,
        duration_ms=12.0,
        status=429,
    )
    trace = parse_trace(format_trace(header, [later, first]))
    assert trace.header == header
    assert trace.requests == (first, later)
    assert trace.skipped == ()


def test_a_bad_line_is_skipped_and_named_and_the_rest_kept() -> None:
    lines = [
        '{"llmgw_trace": 1, "start": 0, "duration_s": 10}',
        '{"t": 1, "model": "m", "project": "p", "prompt_tokens": 5, "completion_tokens": 2}',
        "not json",
        '{"t": 2, "model": "m", "project": "p", "prompt_tokens": -1, "completion_tokens": 2}',
        "",
        '{"t": 3, "model": "", "project": "p", "prompt_tokens": 1, "completion_tokens": 2}',
    ]
    trace = parse_trace(lines)
    assert [r.t for r in trace.requests] == [1.0]
    assert trace.requests[0].ttft_ms is None, "an absent ttft is unknown, not zero"
    assert trace.skipped[0].startswith("line 3: not JSON")
    assert trace.skipped[1] == "line 4: prompt_tokens must be a whole number at or above 0 (got -1)"
    assert trace.skipped[2] == "line 6: model must be a non-empty string (got '')"


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        ([], "the trace is empty"),
        (['{"llmgw_trace": 2}'], "not an llmgw trace of version 1 (llmgw_trace is 2)"),
        (["{"], "line 1: the header is not JSON"),
        (['{"llmgw_trace": 1, "start": "x", "duration_s": 1}'], "line 1: start must be a number"),
    ],
)
def test_a_trace_without_a_good_header_is_refused_with_what_is_wrong(lines: list[str], said: str) -> None:
    with pytest.raises(TraceError, match=said.replace("(", r"\(").replace(")", r"\)")):
        parse_trace(lines)
