"""Request tags: where they come from, which wins, their bounds, and the bounded metric labels."""

from __future__ import annotations

from typing import Any

import pytest
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.fleet.tag_metrics import OTHER
from llmgw_router.path.tags import MAX_KEY, MAX_TAGS, MAX_VALUE, request_tags
from llmgw_router.server.errors import ApiError
from prometheus_client import generate_latest

from llmgw.core.config.models import RouterSettings


def test_a_request_without_tags_has_none() -> None:
    assert request_tags({"model": "m"}, None) is None
    assert request_tags({"model": "m", "user": ""}, "") is None  # an empty user says nothing


def test_metadata_then_user_then_header_later_wins() -> None:
    body: dict[str, Any] = {"metadata": {"app": "body-app", "env": "dev"}, "user": "alice"}
    tags = request_tags(body, "app=gateway-app, team=search")
    assert tags == {"app": "gateway-app", "env": "dev", "user": "alice", "team": "search"}


@pytest.mark.parametrize(
    ("body", "header", "param", "says"),
    [
        ({"metadata": ["app"]}, None, "metadata", "must be an object"),
        ({"metadata": {"app": 3}}, None, "metadata", "of type int"),
        ({"metadata": {"app": ""}}, None, "metadata", "1-512 characters"),
        ({"metadata": {"app": "x" * (MAX_VALUE + 1)}}, None, "metadata", "of 513 characters"),
        ({"metadata": {"k" * (MAX_KEY + 1): "v"}}, None, "metadata", "1-64 letters"),
        ({"metadata": {"a b": "v"}}, None, "metadata", "1-64 letters"),
        ({"user": 7}, None, "user", "must be a string"),
        ({}, "app", "x-llmgw-tags", "is not `key=value`"),
        ({}, "app=", "x-llmgw-tags", "1-512 characters"),
        ({"metadata": {f"k{i}": "v" for i in range(MAX_TAGS)}}, "one=more", "metadata", "at most 16"),
    ],
)
def test_tags_out_of_bounds_are_a_400_that_names_the_place(
    body: dict[str, Any], header: str | None, param: str, says: str
) -> None:
    with pytest.raises(ApiError) as caught:
        request_tags(body, header)
    err = caught.value
    assert (err.status, err.code, err.param) == (400, "invalid_tags", param)
    assert says in str(err), str(err)


def test_only_declared_keys_become_labels_and_values_are_bounded() -> None:
    router_metrics = RouterMetrics(lambda: None, lambda: 0.0)
    metrics, registry = router_metrics.tags, router_metrics.registry
    settings = RouterSettings(tag_labels=["app"], tag_label_values=2)
    for app in ("chat", "search", "chat", "third", "fourth"):
        metrics.observe({"app": app, "user": "alice"}, settings, "m", 10, 2, 0.5)
    page = generate_latest(registry).decode()
    assert 'llmgw_router_tag_requests_total{model="m",tag="app",value="chat"} 2.0' in page
    assert 'llmgw_router_tag_requests_total{model="m",tag="app",value="search"} 1.0' in page
    assert f'llmgw_router_tag_requests_total{{model="m",tag="app",value="{OTHER}"}} 2.0' in page
    assert 'value="third"' not in page and 'value="fourth"' not in page
    assert 'tag="user"' not in page, "a key the repo did not declare is no label"
    assert 'llmgw_router_tag_tokens_total{direction="prompt",tag="app",value="chat"} 20.0' in page
    assert 'llmgw_router_tag_cost_total{tag="app",value="other"} 1.0' in page
    # Counted in a plain dict, added to the series when the registry is collected: a second page, nothing
    # counted since, says the same (nothing added twice).
    assert generate_latest(registry).decode() == page


def test_the_schema_refuses_a_tag_key_that_needs_quoting() -> None:
    with pytest.raises(ValueError, match="tag_labels"):
        RouterSettings(tag_labels=["has space"])


def test_a_tag_label_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="tag_labels names app more than once"):
        RouterSettings(tag_labels=["app", "env", "app"])
