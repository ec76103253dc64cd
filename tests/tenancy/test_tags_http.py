"""Tags through a real router process over a store: from metadata, the x-llmgw-tags header and `user`, kept
with usage (`llmgw usage --by tag:KEY`), counted in metrics for the declared keys only, refused when out of
bounds with an OpenAI-shaped 400."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from support import wait_until

from llmgw.cli.main import app

from .helpers import FAST, cli, create_key, error_of, start_router

pytestmark = pytest.mark.integration


def _by_tag(dsn: str, key: str) -> dict[str | None, dict[str, Any]]:
    rows = json.loads(cli("usage", "--by", f"tag:{key}", "--json", "--store", dsn))
    return {row[f"tag:{key}"]: row for row in rows}


def test_tags_reach_usage_and_only_declared_keys_reach_metrics(
    store_dsn: str, snap: dict[str, Any], tmp_path: Path
) -> None:
    snap["router"] |= {"tag_labels": ["app"], "tag_label_values": 2}
    key = create_key(store_dsn, "usage")
    router = start_router(tmp_path, snap, store_dsn)
    messages: list[Any] = [{"role": "user", "content": "hello"}]
    try:
        with router.client(key) as client:
            for app in ("chat", "chat", "search", "third"):
                client.chat.completions.create(
                    model=FAST, messages=messages, max_tokens=2, metadata={"app": app}, user="alice"
                )
            # The header wins over the body's metadata for the same key (a gateway in front knows best).
            client.chat.completions.create(
                model=FAST,
                messages=messages,
                max_tokens=2,
                metadata={"app": "body"},
                extra_headers={"x-llmgw-tags": "app=chat,team=search"},
            )
            client.chat.completions.create(model=FAST, messages=messages, max_tokens=2)  # untagged
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model=FAST, messages=messages, max_tokens=2, extra_headers={"x-llmgw-tags": "no-equals"}
                )
        err = error_of(refused.value)
        assert (err["code"], err["param"]) == ("invalid_tags", "x-llmgw-tags"), err
        assert "key=value" in err["message"]

        def flushed() -> dict[str | None, dict[str, Any]] | None:
            rows = _by_tag(store_dsn, "app")
            return rows if sum(r["requests"] for r in rows.values()) == 7 else None

        by_app = wait_until(flushed, 30, "7 usage rows")
        with urllib.request.urlopen(router.metrics + "/metrics", timeout=10) as answer:
            page = answer.read().decode()
    finally:
        assert router.stop() == 0, router.text()[-3000:]
    assert {k: v["requests"] for k, v in by_app.items()} == {
        None: 2,  # the untagged request and the refused one: absent, not an empty value
        "chat": 3,
        "search": 1,
        "third": 1,
    }
    assert by_app[None]["errors"] == 1
    by_user = _by_tag(store_dsn, "user")
    assert by_user["alice"]["requests"] == 4
    assert _by_tag(store_dsn, "team")["search"]["requests"] == 1
    table = cli("usage", "--by", "tag:app", "--store", store_dsn)
    assert "(untagged)" in table and "search" in table
    # Declared key `app`, two values per router: chat and search by name, the third as `other`.
    assert 'llmgw_router_tag_requests_total{model="sim-chat",tag="app",value="chat"} 3.0' in page
    assert 'llmgw_router_tag_requests_total{model="sim-chat",tag="app",value="other"} 1.0' in page
    assert 'value="third"' not in page
    assert 'tag="user"' not in page and 'tag="team"' not in page, "undeclared keys are usage only"


@pytest.mark.parametrize(
    ("by", "says"), [("tag:", "names no tag key"), ("colour", "or tag:KEY (e.g. --by tag:app)")]
)
def test_usage_by_a_tag_needs_a_key(by: str, says: str, tmp_path: Path) -> None:
    from .helpers import runner

    result = runner.invoke(app, ["usage", "--by", by, "--store", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 1 and says in result.output, result.output
