"""Request tags as metric labels, for the tag keys the repo declares only, with a bounded set of values.

`Cluster.spec.router.tag_labels` names the keys (at most 8); every other tag is kept with the usage row and
nowhere else. Each declared key counts at most `tag_label_values` distinct values per router process, in the
order they were first seen; later ones are counted as `other`. The series are additive, not multiplied: one
series per (key, value, model), labelled `tag="app", value="chat"`, rather than a label per key on one series
(two keys of 20 values each would then be 400 series per model, and every key added multiplies again). So a
metric has at most len(tag_labels) x (tag_label_values + 1) series per model, whatever clients send.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from llmgw.core.config.models import RouterSettings

__all__ = ["OTHER", "TagMetrics"]

OTHER = "other"  # the label value of every value past a key's bound


# Adds an amount to a counter's series: RouterMetrics.count, which keeps it in a plain dict until the registry
# is collected (a prometheus_client child's inc takes a lock; six of them per request cost more than the rest
# of the tags' work).
Count = Callable[[Counter, tuple[str, ...], float], None]


class TagMetrics:
    def __init__(self, registry: CollectorRegistry, prefix: str, count: Count) -> None:
        self.requests = Counter(
            prefix + "tag_requests",
            "Requests by a declared tag's value (router.tag_labels) and model; values past the bound are `other`",
            ["tag", "value", "model"],
            registry=registry,
        )
        self.tokens = Counter(
            prefix + "tag_tokens",
            "Tokens by a declared tag's value and direction (prompt|completion)",
            ["tag", "value", "direction"],
            registry=registry,
        )
        self.cost = Counter(
            prefix + "tag_cost",
            "Cost charged, by a declared tag's value (the models' prices)",
            ["tag", "value"],
            registry=registry,
        )
        self._seen: dict[str, set[str]] = {}
        self._count = count

    def label_value(self, key: str, value: str, bound: int) -> str:
        """`value` itself while the key has seen fewer than `bound` values (or has seen this one), else other."""
        seen = self._seen.setdefault(key, set())
        if value in seen:
            return value
        if len(seen) < bound:
            seen.add(value)
            return value
        return OTHER

    def observe(
        self,
        tags: dict[str, str],
        settings: RouterSettings,
        model: str,
        prompt: int | None,
        completion: int,
        cost: float,
    ) -> None:
        for key in settings.tag_labels:
            raw = tags.get(key)
            if raw is None:
                continue
            value = self.label_value(key, raw, settings.tag_label_values)
            count = self._count
            count(self.requests, (key, value, model), 1.0)
            if prompt:
                count(self.tokens, (key, value, "prompt"), prompt)
            if completion:
                count(self.tokens, (key, value, "completion"), completion)
            if cost:
                count(self.cost, (key, value), cost)
