"""llmgw.core.jsonsafe reads what json reads, whichever parser did the work (orjson first for bytes)."""

from __future__ import annotations

import json
import math

import pytest

from llmgw.core import jsonsafe

SAME_AS_JSON = [
    b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}',
    b'{"a": 18446744073709551615, "b": -9223372036854775808}',  # the largest orjson keeps whole
    b'{"a": 18446744073709551616}',  # past 64 bits: orjson would read a float
    b'{"seed": 123456789012345678901234567890, "n": -123456789012345678901}',
    b'{"t": 0.7, "z": -0.0, "e": 1E2, "tiny": 1.5e-400}',
    b'{"a": 1, "a": 2}',  # the last wins in both
    b'["\\ud800", "\\u00e9", "\xc3\xa9"]',  # a lone surrogate: orjson refuses, json keeps it
    b"[NaN, Infinity, -Infinity, 1e400]",  # not JSON, but json has always taken them
    b"\xef\xbb\xbf{}".decode("utf-8-sig").encode("utf-16"),  # UTF-16 with its mark
    b'"12345678901234567890 digits in a string"',
]


@pytest.mark.parametrize("doc", SAME_AS_JSON)
def test_reads_what_json_reads(doc: bytes) -> None:
    got, want = jsonsafe.loads(doc), json.loads(doc)
    assert repr(got) == repr(want) or (_nan_in(got) and _nan_in(want))
    assert json.dumps(got) == json.dumps(want)  # the same document when encoded again (ints stay ints)


@pytest.mark.parametrize("doc", [b"", b"not json", b'{"a": 1,}', b"[1,]", b'{"a":"x\ny"}', b"\xff"])
def test_refuses_what_json_refuses_with_its_words(doc: bytes) -> None:
    with pytest.raises(ValueError) as want:
        json.loads(doc)
    with pytest.raises(ValueError) as got:
        jsonsafe.loads(doc)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("depth", [jsonsafe.MAX_DEPTH + 1, 2_000, 200_000])
def test_too_deep_is_refused_whichever_parser_reads_it(depth: int) -> None:
    with pytest.raises(jsonsafe.JsonTooDeep):
        jsonsafe.loads(b"[" * depth + b"]" * depth)
    assert jsonsafe.loads(b"[" * jsonsafe.MAX_DEPTH + b"]" * jsonsafe.MAX_DEPTH) is not None


def _nan_in(value: object) -> bool:
    return isinstance(value, list) and any(isinstance(v, float) and math.isnan(v) for v in value)
