"""Property tests: whatever text or YAML-shaped structure the loader is given, it returns errors or a repo."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings, strategies as st
from ruamel.yaml import YAML

from llmgw.adapters.repo_files import load_repo
from llmgw.core.config.models import DOCUMENT_KINDS
from llmgw.core.desired.repo import LoadResult, default_schemas, validate_files

SCHEMAS = default_schemas()  # generated once, not once per example

KEYS = st.sampled_from(
    [
        "apiVersion",
        "kind",
        "metadata",
        "name",
        "spec",
        "profiles",
        "engine",
        "gpus",
        "tp",
        "scaling",
        "min",
        "max",
        "fallbacks",
        "aliases",
        "secret",
        "token",
        "env",
        "file",
        "context_length",
        "models",
        "team",
        "organization",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from([*DOCUMENT_KINDS, "llmgw/v1", "sim", "llamacpp", "vllm", "m", "10m"]),
)
STRUCTURES = st.recursive(
    SCALARS,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(KEYS, st.text(max_size=8), st.integers()), children, max_size=5),
    ),
    max_leaves=30,
)


def check(result: LoadResult) -> None:
    assert isinstance(result, LoadResult)
    assert result.ok == (result.repo is not None)
    assert result.ok or result.errors
    for error in result.errors:
        assert error.line >= 1 and error.col >= 1 and error.message
        error.format_text(), error.format_github(), error.to_json()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    check(validate_files({"f.yaml": text.encode("utf-8", "surrogatepass")}, schemas=SCHEMAS))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    check(validate_files({"f.yaml": data}, schemas=SCHEMAS))


def dump(documents: list[Any]) -> str:
    yaml = YAML(typ="safe", pure=True)
    buffer = io.StringIO()
    yaml.dump_all(documents, buffer)
    return buffer.getvalue()


@settings(max_examples=200, deadline=None)
@given(st.lists(STRUCTURES, min_size=1, max_size=3))
def test_arbitrary_yaml_structures_never_raise(documents: list[Any]) -> None:
    check(validate_files({"f.yaml": dump(documents).encode()}, schemas=SCHEMAS))


DOCUMENT_LIKE = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from(["llmgw/v1", "v2"]),
        "kind": st.sampled_from([*DOCUMENT_KINDS, "Thing"]),
        "metadata": st.fixed_dictionaries({"name": st.sampled_from(["m", "n", "Bad Name"])}),
    },
    optional={"spec": STRUCTURES},
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(DOCUMENT_LIKE, min_size=1, max_size=4), st.text(max_size=40))
def test_document_shaped_structures_on_disk_never_raise(
    tmp_path: Path, documents: list[Any], noise: str
) -> None:
    (tmp_path / "docs.yaml").write_text(dump(documents))
    (tmp_path / "noise.yml").write_text(noise, encoding="utf-8", errors="surrogatepass")
    check(load_repo(tmp_path))
