"""One /metrics page for a router of several workers: each worker's page, merged by what each series means.

Counters, histograms and summaries are summed (requests answered by the router are the requests answered by
its workers). Gauges are merged by meaning (`GAUGE_RULES`): counts of things in this router (queue depth,
requests in flight to an endpoint, usage records pending) are summed; what every worker reads from the same
source (an engine's running and waiting counts, KV use, a state flag, the snapshot's revision, budget use)
is the largest any worker reports, so a state one worker sees (a breaker open) is not averaged away; the
controller link is connected only when every worker's is (the smallest).

A worker that dies takes its counts with it. So that the router's counters never go backwards (Prometheus
would read that as a reset and count everything again), what a worker last reported is kept when it is
replaced and added to the sums from then on (`Merger.retire`): only what it counted after its last scrape
is lost. A live worker that does not answer a scrape counts with its last page for counters and is left out
of the gauges (unknown is not zero).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

__all__ = ["GAUGE_RULES", "Merger", "Page", "parse_page"]

Rule = Literal["sum", "max", "min"]
P = "llmgw_router_"
# Gauges not named here are summed.
GAUGE_RULES: dict[str, Rule] = {
    P + "endpoint_state": "max",
    P + "endpoint_running": "max",
    P + "endpoint_waiting": "max",
    P + "endpoint_kv_usage": "max",
    P + "metrics_contract_violations": "max",
    P + "breaker_open": "max",
    P + "provider_unavailable": "max",
    P + "snapshot_info": "max",
    P + "budget_used_ratio": "max",
    P + "controller_connected": "min",
}
_SUMMED_TYPES = ("counter", "histogram", "summary", "gaugehistogram")

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # sample name, sorted labels


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    documentation: str


@dataclass
class Page:
    """One worker's page, parsed: its families (in order) and each sample's value."""

    families: dict[str, Family] = field(default_factory=dict)
    samples: dict[str, dict[SeriesKey, float]] = field(default_factory=dict)  # by family name


def parse_page(text: str) -> Page:
    page = Page()
    for fam in text_string_to_metric_families(text):
        page.families.setdefault(fam.name, Family(fam.name, fam.type, fam.documentation))
        values = page.samples.setdefault(fam.name, {})
        for s in fam.samples:
            values[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return page


def _rule(family: Family, sample_name: str) -> Rule:
    if sample_name.endswith("_created"):
        return "min"  # when the oldest worker's series began
    if family.type in _SUMMED_TYPES:
        return "sum"
    return GAUGE_RULES.get(family.name, "sum")


def _counted(family: Family, sample_name: str) -> bool:
    """Whether a series is a running total that must be carried over from a worker that ended."""
    return family.type in _SUMMED_TYPES and not sample_name.endswith("_created")


class Merger:
    """The merge, with what replaced workers had counted (`retire`)."""

    def __init__(self) -> None:
        self._retired: dict[str, dict[SeriesKey, float]] = {}
        self._retired_families: dict[str, Family] = {}

    def retire(self, last: Page | None) -> None:
        """A worker ended; `last` is the last page it answered: its totals stay in the sums."""
        if last is None:
            return
        for name, values in last.samples.items():
            family = last.families[name]
            for key, value in values.items():
                if _counted(family, key[0]):
                    self._retired_families.setdefault(name, family)
                    kept = self._retired.setdefault(name, {})
                    kept[key] = kept.get(key, 0.0) + value

    def merge(self, live: Iterable[Page], stale: Iterable[Page] = ()) -> bytes:
        """The text of the merged page: `live` answered this scrape, `stale` did not (last page kept)."""
        families: dict[str, Family] = dict(self._retired_families)
        merged: dict[str, dict[SeriesKey, float]] = {n: dict(v) for n, v in self._retired.items()}
        pages = [(p, True) for p in live] + [(p, False) for p in stale]
        for page, answered in pages:
            for name, values in page.samples.items():
                family = families.setdefault(name, page.families[name])
                into = merged.setdefault(name, {})
                for key, value in values.items():
                    if not answered and not _counted(family, key[0]):
                        continue
                    into[key] = _combine(_rule(family, key[0]), into.get(key), value)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Merged(families, merged))
        return generate_latest(registry)


def _combine(rule: Rule, have: float | None, value: float) -> float:
    if have is None:
        return value
    if rule == "sum":
        return have + value
    return max(have, value) if rule == "max" else min(have, value)


class _Merged(Collector):
    def __init__(self, families: Mapping[str, Family], samples: Mapping[str, dict[SeriesKey, float]]) -> None:
        self._families = families
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        for name, family in self._families.items():
            metric = Metric(name, family.documentation, family.type)
            for (sample, labels), value in self._samples.get(name, {}).items():
                metric.add_sample(sample, dict(labels), value)
            yield metric
