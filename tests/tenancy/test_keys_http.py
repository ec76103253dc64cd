"""Key lifecycle through a real router process over the store: every answer a client can get for its key."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from support import wait_until

from .helpers import FAST, OTHER, cli, create_expired_key, create_key, error_of, start_router

pytestmark = pytest.mark.integration

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def _refusal(client: openai.OpenAI, model: str = FAST) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model=model, messages=HELLO, max_tokens=2)
    return caught.value


def test_key_lifecycle(store_dsn: str, snap: dict[str, Any], tmp_path: Path) -> None:
    key = create_key(store_dsn, "keys")
    never_used = create_key(store_dsn, "keys")
    expired = create_expired_key(store_dsn, "keys")
    router = start_router(tmp_path, snap, store_dsn, key_cache_ttl=1.0)
    try:
        with router.client(key) as client:
            done = client.chat.completions.create(model=FAST, messages=HELLO, max_tokens=2)
            assert done.usage is not None and done.usage.completion_tokens == 2

            # a project not allowed the model: 403, whatever the key
            denied = _refusal(client, OTHER)
            assert denied.status_code == 403 and error_of(denied)["code"] == "model_not_allowed"
            assert "keys" in error_of(denied)["message"] and OTHER in error_of(denied)["message"]

        listed = {k["id"]: k for k in json.loads(cli("keys", "list", "--json", "--store", store_dsn))}
        ids = {k["prefix"]: k["id"] for k in listed.values()}
        never_id = next(i for p, i in ids.items() if never_used.startswith(p))
        key_id = next(i for p, i in ids.items() if key.startswith(p))

        # revoked before the router ever saw it: refused at once
        cli("keys", "revoke", never_id, "--store", store_dsn)
        with router.client(never_used) as client:
            gone = _refusal(client)
        assert gone.status_code == 401 and error_of(gone)["code"] == "key_revoked"
        assert "revoked" in error_of(gone)["message"]

        with router.client(expired) as client:
            old = _refusal(client)
        assert old.status_code == 401 and error_of(old)["code"] == "key_expired"
        assert "expired" in error_of(old)["message"]

        with router.client("sk-llmgw-" + "x" * 43) as client:
            unknown = _refusal(client)
        assert isinstance(unknown, openai.AuthenticationError)
        assert (
            error_of(unknown)["code"] == "invalid_api_key"
            and "not a known key" in error_of(unknown)["message"]
        )

        body = json.dumps({"model": FAST, "messages": HELLO}).encode()
        plain = urllib.request.Request(router.base_url + "/chat/completions", data=body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as no_key:
            urllib.request.urlopen(plain, timeout=30)
        assert no_key.value.code == 401
        assert json.loads(no_key.value.read())["error"]["code"] == "missing_api_key"

        # revoked while in use: the router's key cache answers for at most its TTL (1 s here), then 401 revoked
        cli("keys", "revoke", key_id, "--store", store_dsn)
        with router.client(key) as client:

            def refused() -> openai.APIStatusError | None:
                try:
                    client.chat.completions.create(model=FAST, messages=HELLO, max_tokens=1)
                except openai.APIStatusError as exc:
                    return exc
                return None

            late = wait_until(refused, 20, "the revoked key to be refused")
        assert late.status_code == 401 and error_of(late)["code"] == "key_revoked"
    finally:
        assert router.stop() == 0, router.text()[-3000:]
