"""The sim's wrong-on-purpose options: an even, deterministic error rate; configured answers; probes failed."""

from __future__ import annotations

import pytest
from llmgw_agent.sim_cli import behaviour_from_args, build_parser
from llmgw_agent.sim_model import ErrorPacer, canned_answer, parse_answers, schema_sample


@pytest.mark.parametrize(("rate", "fails"), [(0.0, 0), (0.25, 25), (0.5, 50), (1.0, 100)])
def test_the_error_rate_is_spread_evenly(rate: float, fails: int) -> None:
    pacer = ErrorPacer(rate)
    seen = [pacer.fail() for _ in range(100)]
    assert sum(seen) == fails
    if rate == 0.5:
        assert seen[:4] == [False, True, False, True]


def test_answers_and_schema_samples() -> None:
    answers = parse_answers("France=Paris;*=PASS")
    assert (
        canned_answer(answers, {"messages": [{"role": "user", "content": "capital of France?"}]}) == "Paris"
    )
    assert canned_answer(answers, {"messages": [{"role": "user", "content": "anything"}]}) == "PASS"
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"enum": ["x"]}},
        "required": ["a"],
    }
    assert schema_sample(schema) == {"a": 1}
    with pytest.raises(ValueError, match="not key=answer"):
        parse_answers("no equals sign")


def test_bad_options_are_refused_with_what_is_known() -> None:
    parser = build_parser()
    with pytest.raises(
        SystemExit, match=r"unknown probe\(s\) tool; known: tools, response_format, stream_usage"
    ):
        behaviour_from_args(parser.parse_args(["--port", "1", "--model", "m", "--fail-probes", "tool"]))
    with pytest.raises(SystemExit, match="between 0 and 1"):
        behaviour_from_args(parser.parse_args(["--port", "1", "--model", "m", "--error-rate", "2"]))
