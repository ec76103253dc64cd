"""What `store` and `previous_response_id` mean for a project (responses_kept.plan_storage), and what a kept
response holds and continues with: pure, every combination."""

from __future__ import annotations

import base64
import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from llmgw_router.app import build_router
from llmgw_router.main import content_key
from llmgw_router.options import RouterOptions
from llmgw_router.server.errors import ApiError
from llmgw_router.surfaces.responses.exchange import ResponsesTurn
from llmgw_router.surfaces.responses.keeper import ResponseKeeper
from llmgw_router.surfaces.responses.kept import (
    NO_STORAGE,
    Storage,
    continued_input,
    kept_record,
    plan_storage,
    read_record,
)

from llmgw.core.config.models import ContentRetention
from llmgw.core.snapshot import Tenants
from llmgw.store.queries.content import ContentVault
from llmgw.store.store import Store

KEEPS = ContentRetention(content=True, ttl="2h")
OFF = ContentRetention(content=False)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, Storage(7200.0)),  # absent store: OpenAI's default, kept where the project keeps content
        ({"store": True}, Storage(7200.0)),
        ({"store": False}, NO_STORAGE),
        ({"store": None}, Storage(7200.0)),
        ({"previous_response_id": "resp_a"}, Storage(7200.0, "resp_a")),
        ({"previous_response_id": "resp_a", "store": False}, Storage(None, "resp_a")),
    ],
)
def test_an_opted_in_project_keeps_unless_told_not_to(body: dict[str, Any], expected: Storage) -> None:
    assert plan_storage(body, "p", KEEPS, has_key=True) == expected


@pytest.mark.parametrize(
    ("retention", "project", "has_key"),
    [(None, "p", True), (OFF, "p", True), (KEEPS, None, True), (KEEPS, "p", False)],
)
def test_without_the_opt_in_absent_store_is_served_and_asking_is_a_400(
    retention: ContentRetention | None, project: str | None, has_key: bool
) -> None:
    assert plan_storage({}, project, retention, has_key) == NO_STORAGE
    assert plan_storage({"store": False}, project, retention, has_key) == NO_STORAGE
    for body, param, code in (
        ({"store": True}, "store", "store_unsupported"),
        ({"previous_response_id": "resp_a"}, "previous_response_id", "previous_response_not_found"),
    ):
        with pytest.raises(ApiError) as err:
            plan_storage(body, project, retention, has_key)
        assert (err.value.status, err.value.param, err.value.code) == (400, param, code)
        assert "content-retention" in err.value.message
        if not has_key:  # the project did opt in: the router lacks the key, and says so
            assert "--content-key-file" in err.value.message


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"conversation": "conv_1"}, "conversation", "store_unsupported"),
        ({"store": "yes"}, "store", "invalid_type"),
        ({"store": 1}, "store", "invalid_type"),
        ({"previous_response_id": 7}, "previous_response_id", "invalid_type"),
        ({"previous_response_id": ""}, "previous_response_id", "invalid_type"),
    ],
)
def test_malformed_storage_fields_are_400s_naming_them(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ApiError) as err:
        plan_storage(body, "p", KEEPS, has_key=True)
    assert (err.value.status, err.value.param, err.value.code) == (400, param, code)


def test_continuing_prepends_history_input_and_output_in_order() -> None:
    out1 = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a1"}]}
    first = read_record(kept_record([], "q1", {"id": "resp_1", "output": [out1]}))
    history = continued_input(first, None)
    assert [i["role"] for i in history] == ["user", "assistant"]
    assert history[0]["content"] == [{"type": "input_text", "text": "q1"}]
    out2 = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    second = read_record(kept_record(history, [{"role": "user", "content": "q2"}], {"output": [out2]}))
    assert continued_input(second, "q3") == [
        *history,
        {"role": "user", "content": "q2"},
        out2,
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q3"}]},
    ]


def test_a_record_of_another_shape_is_refused() -> None:
    for data in (b"[]", b'{"v": 2, "response": {}}', b'{"v": 1}'):
        with pytest.raises(ValueError):
            read_record(data)


def test_the_routers_content_key_file_is_checked_at_start(tmp_path: Path) -> None:
    good = tmp_path / "content.key"
    good.write_text(base64.b64encode(bytes(range(32))).decode() + "\n")
    assert content_key(str(good)) == bytes(range(32))
    assert content_key(None) is None
    short = tmp_path / "short.key"
    short.write_text(base64.b64encode(b"x" * 16).decode())
    for path, why in ((short, "16 bytes; it must be 32"), (tmp_path / "absent.key", "No such file")):
        with pytest.raises(ValueError) as err:
            content_key(str(path))
        assert f"--content-key-file {path}" in str(err.value) and why in str(err.value)


async def test_a_content_key_without_a_store_is_refused() -> None:
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(ValueError, match="needs a store"):
            await build_router(stack, RouterOptions(), content_key=bytes(32))


async def test_a_stored_turn_is_translated_even_for_an_engine_that_serves_responses(tmp_path: Path) -> None:
    store = await Store.open(f"sqlite:///{tmp_path / 'llmgw.db'}")
    try:
        keeper = ResponseKeeper(ContentVault(store, bytes(32)))
        projects = {
            "keeps": {"organization": "o", "retention": {"content": True}},
            "plain": {"organization": "o"},
        }
        tenants = Tenants.model_validate({"organizations": {"o": {}}, "projects": projects})
        body = {"model": "m", "input": "hi"}
        for project, kind, kept in (("plain", "responses", False), ("keeps", "chat", True)):
            turn = ResponsesTurn(keeper)
            turn.begin(body, json.dumps(body).encode(), "rid")
            await turn.bind(project, tenants)
            assert turn.for_engine("vllm")[0] == kind
            assert turn.ids.store is kept and (turn.ids.response == "resp_rid") is not kept  # a random id
    finally:
        await store.close()
