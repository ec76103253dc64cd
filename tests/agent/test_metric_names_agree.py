"""The engines' metric names live in two places by design: the agent's built-in table
(llmgw_agent.engines.EngineMetrics, one per engine; the agent imports nothing of llmgw's) and the Cluster's
per-engine override (llmgw.core.config.specs.engine_spec.MetricMapping, published in the snapshot). The router reads
the override where one is given, the table otherwise (fleet/table.metric_names_for). These tests keep the two
saying the same thing: a field added, renamed or made optional on one side alone fails here."""

from __future__ import annotations

import dataclasses

import pytest
from llmgw_agent.engines import EngineMetrics, metric_mapping
from llmgw_agent.protocol import ENGINE_NAMES
from llmgw_router.fleet.table import metric_names_for

from llmgw.core.config.specs.engine_spec import MetricMapping
from llmgw.core.snapshot import RouterSnapshot

# What the built-in table says that a Cluster cannot override (where to scrape and how, the token counters).
NOT_OVERRIDDEN = {
    "metrics_path",
    "metrics_needs_key",
    "prompt_tokens",
    "generation_tokens",
    "kv_usage_alternatives",
}


def test_the_override_names_the_tables_fields_and_no_others() -> None:
    table = {f.name: f for f in dataclasses.fields(EngineMetrics)}
    override = MetricMapping.model_fields
    assert set(override) <= set(table), (
        f"override fields the agent's table lacks: {set(override) - set(table)}"
    )
    assert set(table) - set(override) == NOT_OVERRIDDEN, (
        "a field of the agent's table is neither in the Cluster's override nor listed as not overridden"
    )
    for name, info in override.items():
        optional_in_table = "None" in str(table[name].type)
        assert info.is_required() == (not optional_in_table), (
            f"`{name}` is {'required' if info.is_required() else 'optional'} in the Cluster's override and "
            f"{'optional' if optional_in_table else 'required'} in the agent's table"
        )


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_an_override_that_restates_the_table_changes_nothing(engine: str) -> None:
    builtin = metric_mapping(engine)
    restated = MetricMapping(**{name: getattr(builtin, name) for name in MetricMapping.model_fields})
    plain = RouterSnapshot(revision="r")
    overridden = RouterSnapshot(revision="r", metric_mappings={engine: restated})
    (names, path), (names_over, path_over) = (
        metric_names_for(plain, engine),
        metric_names_for(overridden, engine),
    )
    assert path_over == path == builtin.metrics_path
    # An override is a complete statement, so the table's older names (kv_usage_alternatives) are not kept.
    assert dataclasses.replace(names, kv_alternatives=()) == names_over
    assert (names.running, names.waiting, names.kv_usage) == (
        builtin.running,
        builtin.waiting,
        builtin.kv_usage,
    )
