"""The observability kit holds together: promtool accepts the rules, the rule unit tests and the scrape
config; the Grafana dashboard loads and its queries parse; and every metric an alert or a panel names is one
docs/metrics.md documents, so the three cannot drift apart silently.

promtool comes from Debian's `prometheus` package (scripts/install-system-deps.sh). Where it is missing the
promtool tests skip with the reason locally, and fail when CI or LLMGW_REQUIRE_TOOLS is set, so CI never
passes by skipping them.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from llmgw_agent import health
from llmgw_agent.protocol import NodeThermals
from llmgw_agent.thermals import parse_gpu_thermals
from llmgw_router.fleet.metrics import RouterMetrics
from llmgw_router.path.service import RequestService
from prometheus_client import generate_latest
from ruamel.yaml import YAML

from llmgw.controller.parts.metrics import ControllerMetrics

from .tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "observability"
RULES = KIT / "alerts.rules.yml"
CONFIG = KIT / "prometheus.yml"
DASHBOARD = KIT / "grafana-dashboard.json"
RULE_TESTS = sorted((KIT / "tests").glob("*.yml"))
METRICS_DOC = ROOT / "docs" / "metrics.md"
ALERTS_DOC = ROOT / "docs" / "alerts.md"

METRIC_NAME = re.compile(r"\bllmgw_[a-z0-9_]+")
# A documented metric is a table row whose first cell is the name in backticks and second its type.
DOC_ROW = re.compile(r"^\|\s*`(llmgw_[a-z0-9_]+)`\s*\|\s*(counter|gauge|histogram|info)\s*\|", re.MULTILINE)
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
SEVERITIES = {"critical", "warning", "info"}


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_tool("promtool")


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=240, check=False)


def _load_yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str
    labels: dict[str, str]
    annotations: dict[str, str]


def _alert_rules() -> list[Rule]:
    rules = []
    for group in _load_yaml(RULES)["groups"]:
        for raw in group["rules"]:
            assert "alert" in raw, (
                f"{RULES.name}: group {group['name']} has a recording rule; keep alerts only"
            )
            rules.append(
                Rule(raw["alert"], raw["expr"], raw.get("labels") or {}, raw.get("annotations") or {})
            )
    return rules


def _dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def _dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    queries = [
        (f"panel {panel['id']} {panel['title']!r} target {target['refId']}", target["expr"])
        for panel in _panels(dashboard)
        for target in panel.get("targets", [])
    ]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            queries.append((f"variable {var['name']}", query))
    return queries


PENDING_HEADING = "## Not exported yet"


def _doc_sections() -> tuple[dict[str, str], dict[str, str]]:
    """(exported, pending): metric -> type, from the tables above and below the "Not exported yet" heading."""
    text = METRICS_DOC.read_text()
    exported, _, pending = text.partition(PENDING_HEADING)
    return dict(DOC_ROW.findall(exported)), dict(DOC_ROW.findall(pending))


def _documented_metrics() -> dict[str, str]:
    exported, pending = _doc_sections()
    return exported | pending


def _exported_by_code() -> dict[str, str]:
    """metric -> type for every family the controller's and the router's registries publish, and the agent's
    node-health families (written without prometheus-client, declared in llmgw_agent.health)."""
    # The request service's registry: RouterMetrics' families and those of the parts it adds (the cache's).
    registries = [ControllerMetrics().registry, RequestService().metrics.registry]
    suffix = {"counter": "_total", "info": "_info"}
    return {
        family.name + suffix.get(family.type, ""): family.type
        for registry in registries
        for family in registry.collect()
    } | health.exported_names()


def _grafana_to_promql(expr: str) -> str:
    """Replace Grafana's template variables by values Prometheus accepts, so promtool can parse the query."""
    expr = re.sub(r"\$__(rate_)?interval|\$__range", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


# ------------------------------------------------------------------------------------------------ promtool


def test_promtool_accepts_the_alert_rules(promtool: str) -> None:
    result = _run(promtool, "check", "rules", RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_alert_rules())} rules found" in result.stdout


def test_promtool_rule_unit_tests_pass(promtool: str) -> None:
    assert RULE_TESTS, "observability/tests/ holds no promtool test files"
    result = _run(promtool, "test", "rules", *RULE_TESTS)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_scrape_config(promtool: str) -> None:
    result = _run(promtool, "check", "config", CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    config = _load_yaml(CONFIG)
    assert {job["job_name"] for job in config["scrape_configs"]} == {"llmgw-controller", "llmgw-router"}
    assert config["rule_files"] == [RULES.name]


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    # promtool has no offline "parse this expression"; a recording rule per query gets the same parser.
    queries = _dashboard_queries(_dashboard())
    rules = [
        {"record": f"dashboard:query_{i}", "expr": _grafana_to_promql(q)}
        for i, (_, q) in enumerate(queries)
        if not q.startswith("label_values(")
    ]
    path = tmp_path / "dashboard-queries.rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _run(promtool, "check", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_lints_the_exported_metrics(promtool: str) -> None:
    # Naming and HELP conventions (counters end in _total, units in names) checked on a real exposition.
    controller = ControllerMetrics()
    router = RouterMetrics(lambda: None, lambda: 0.0)
    controller.nodes.labels("Ready").set(3)
    controller.reconcile_passes.inc()
    router.requests.labels("sim-chat", "200", "").inc()
    router.duration.labels("sim-chat").observe(0.25)
    router.observe_tokens("sim-chat", 12, 34)
    agent = health.render(
        health.series_of(_agent_sample(), version="1.0", node="n", engine_exits={("m", "sim"): 2})
    )
    exposition = generate_latest(controller.registry) + generate_latest(router.registry) + agent.encode()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=240, check=False
    )
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def _agent_sample() -> health.Sample:
    """A node with one GPU and every host family, so the lint sees each agent family once."""
    row = "0, GPU-1, NVIDIA L4, 37, 1024, 23034, 41, 72.5, 0, 3\n"
    return health.Sample(
        taken_at=1.7e9,
        gpus=health.parse_gpu_health(row),
        smi_up=True,
        cpu_seconds={"user": 10.5, "idle": 100.0},
        cpu_cores=4,
        memory={"MemTotal": 2**34, "MemAvailable": 2**33},
        filesystems=[("weights", "/var/lib/llmgw/weights", 10**12, 10**11)],
        network={"eth0": (1000, 2000)},
        thermals=NodeThermals(
            taken_at=1.7e9,
            gpus=parse_gpu_thermals("0, 41, 52, 72.50, 72.00, 0x0000000000000004\n"),
            cpu_temperature_c=55.0,
            inlet_temperature_c=22.0,
            cpu_package_power_w={"package-0": 95.5},
        ),
    )


def test_the_agent_sample_covers_every_agent_family() -> None:
    # Guards the lint above: a family added to llmgw_agent.health without a value here would go unlinted.
    rendered = health.render(
        health.series_of(_agent_sample(), version="1", node="n", engine_exits={("m", "sim"): 0})
    )
    assert {f for f in health.exported_names() if f"\n{f}" not in rendered} == set()


# ------------------------------------------------------------------------------------- rules and their tests


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    rules = _alert_rules()
    names = [r.alert for r in rules]
    assert len(names) == len(set(names)), f"alert names repeat: {names}"
    for rule in rules:
        assert rule.labels.get("severity") in SEVERITIES, (
            f"{rule.alert}: severity must be one of {SEVERITIES}"
        )
        for key in ("summary", "description", "runbook"):
            assert rule.annotations.get(key, "").strip(), f"{rule.alert}: annotation {key!r} is missing"
        assert rule.annotations["runbook"] == f"docs/alerts.md#{rule.alert.lower()}", rule.alert


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for path in RULE_TESTS:
        for case in _load_yaml(path)["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    alerts = {r.alert for r in _alert_rules()}
    assert alerts - firing == set(), "alerts with no promtool case where they fire"
    assert alerts - quiet == set(), "alerts with no promtool case where they stay quiet"
    assert (firing | quiet) - alerts == set(), "promtool cases for alerts that do not exist"


def test_every_alert_is_explained_in_docs_alerts() -> None:
    headings = set(re.findall(r"^## (Llmgw\w+)\s*$", ALERTS_DOC.read_text(), re.MULTILINE))
    alerts = {r.alert for r in _alert_rules()}
    assert alerts - headings == set(), "alerts without a `## Name` section in docs/alerts.md"
    assert headings - alerts == set(), "docs/alerts.md explains alerts the rules do not have"


# ----------------------------------------------------------------------------- dashboard and metric names


def test_dashboard_loads_with_unique_panels_on_the_chosen_datasource() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    panels = list(_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    assert any(
        v["type"] == "datasource" and v["name"] == "datasource" for v in dashboard["templating"]["list"]
    )
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        assert panel["datasource"]["uid"] == "${datasource}", f"panel {panel['title']!r} pins a datasource"


def _undocumented(where_and_queries: list[tuple[str, str]], documented: dict[str, str]) -> list[str]:
    allowed = set(documented)
    allowed |= {
        name + suffix
        for name, kind in documented.items()
        if kind == "histogram"
        for suffix in HISTOGRAM_SERIES
    }
    return [
        f"{where}: {name}"
        for where, query in where_and_queries
        for name in METRIC_NAME.findall(query)
        if name not in allowed
    ]


def test_metrics_doc_lists_metrics_once() -> None:
    names = [name for name, _ in DOC_ROW.findall(METRICS_DOC.read_text())]
    assert len(names) > 20, "docs/metrics.md table rows not found: | `name` | type | labels | meaning |"
    assert len(names) == len(set(names)), "a metric is documented twice"


def test_metrics_doc_lists_exactly_what_the_code_exports() -> None:
    exported, pending = _doc_sections()
    code = _exported_by_code()
    assert sorted(set(code) - set(exported)) == [], "exported by the code, missing from docs/metrics.md"
    assert sorted(set(exported) - set(code)) == [], (
        "documented in docs/metrics.md but not exported (move it under 'Not exported yet' or fix the name)"
    )
    wrong_type = {
        name: (exported[name], kind) for name, kind in code.items() if exported.get(name, kind) != kind
    }
    assert wrong_type == {}, "documented type differs from the exported one: (documented, exported)"
    assert sorted(set(pending) & set(code)) == [], (
        "now exported: move these rows from 'Not exported yet' into their process's table"
    )


def test_every_metric_in_an_alert_is_documented() -> None:
    used = [(f"alert {r.alert}", r.expr) for r in _alert_rules()]
    assert _undocumented(used, _documented_metrics()) == []


def test_every_metric_in_the_dashboard_is_documented() -> None:
    assert _undocumented(_dashboard_queries(_dashboard()), _documented_metrics()) == []


def test_the_name_check_catches_an_undocumented_metric() -> None:
    # Guards the guard: a typo in a query must be reported, including a histogram suffix on a non-histogram.
    documented = {
        "llmgw_router_requests_total": "counter",
        "llmgw_router_request_duration_seconds": "histogram",
    }
    queries = [
        ("ok", "rate(llmgw_router_requests_total[5m]) + llmgw_router_request_duration_seconds_bucket"),
        ("typo", "rate(llmgw_router_request_total[5m])"),
        ("suffix", "llmgw_router_requests_total_count"),
    ]
    assert _undocumented(queries, documented) == [
        "typo: llmgw_router_request_total",
        "suffix: llmgw_router_requests_total_count",
    ]


SELECTOR = re.compile(r"\b(llmgw_[a-z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def _doc_rows() -> dict[str, str]:
    """metric -> its whole table row in docs/metrics.md (labels and meaning, where label values are listed)."""
    return {
        m.group(1): m.group(0)
        for m in re.finditer(r"^\|\s*`(llmgw_[a-z0-9_]+)`.*$", METRICS_DOC.read_text(), re.M)
    }


def _unlisted_label_values(where_and_queries: list[tuple[str, str]], rows: dict[str, str]) -> list[str]:
    """Label values a query matches on that the metric's row in docs/metrics.md does not list in backticks.

    Only literal alternatives are checked (`state="ready"`, `reason=~"queue_full|timeout"`); patterns such as
    `status=~"5.."` and Grafana variables are left alone.
    """
    out = []
    for where, query in where_and_queries:
        for metric, matchers in SELECTOR.findall(query):
            for label, op, value in MATCHER.findall(matchers):
                if op not in ("=", "=~") or "$" in value or label in ("job", "instance"):
                    continue
                for alternative in value.split("|") if op == "=~" else [value]:
                    if re.fullmatch(r"[\w:-]+", alternative) and f"`{alternative}`" not in rows.get(
                        metric, ""
                    ):
                        out.append(f"{where}: {metric}{{{label}={alternative!r}}}")
    return out


def test_every_label_value_an_alert_matches_is_documented() -> None:
    # A renamed state ("ready" -> "Ready") would silently stop an alert from ever firing.
    used = [(f"alert {r.alert}", r.expr) for r in _alert_rules()]
    assert _unlisted_label_values(used, _doc_rows()) == []


def test_every_label_value_a_panel_matches_is_documented() -> None:
    assert _unlisted_label_values(_dashboard_queries(_dashboard()), _doc_rows()) == []


def test_the_label_value_check_catches_a_renamed_state() -> None:
    rows = {"llmgw_controller_nodes": "| `llmgw_controller_nodes` | gauge | `state` | `Ready`, `Lost` |"}
    queries = [
        ("q", 'llmgw_controller_nodes{state="Lost"} + llmgw_controller_nodes{state=~"Ready|Gone",job="x"}')
    ]
    assert _unlisted_label_values(queries, rows) == ["q: llmgw_controller_nodes{state='Gone'}"]


def test_a_missing_tool_skips_locally_and_fails_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("LLMGW_REQUIRE_TOOLS", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not found"):
        require_tool("llmgw-no-such-tool")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="error, not a skip"):
        require_tool("llmgw-no-such-tool")
    monkeypatch.setenv("CI", "false")
    monkeypatch.setenv("LLMGW_REQUIRE_TOOLS", "1")
    with pytest.raises(pytest.fail.Exception):
        require_tool("llmgw-no-such-tool")
