"""Reading engine metrics pages with each engine's names; bad pages are values, never exceptions."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st
from llmgw_agent.engines import metric_mapping
from llmgw_router.decisions.scrape_parse import MetricNames, Sample, ScrapeError, parse_metrics


def names(engine: str) -> MetricNames:
    m = metric_mapping(engine)
    return MetricNames(m.running, m.waiting, m.kv_usage, tuple(m.kv_usage_alternatives))


VLLM_PAGE = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_waiting{model_name="m",engine="0"} 2
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.42
vllm:time_to_first_token_seconds_bucket{model_name="m",le="+Inf"} 7
"""

LLAMACPP_PAGE = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
llamacpp:requests_deferred 4
llamacpp:prompt_tokens_total 100
llamacpp:n_busy_slots_per_decode 0.5
"""

SGLANG_PAGE = """sglang:num_running_reqs{model_name="m",tp_rank="0"} 5
sglang:num_queue_reqs{model_name="m",tp_rank="0"} 1
sglang:token_usage{model_name="m",tp_rank="0"} 0.8
"""

TRTLLM_PAGE = """trtllm_num_requests_running{model="m"} 2
trtllm_num_requests_waiting{model="m"} 0
trtllm_kv_cache_utilization{model="m"} 0.1
"""


@pytest.mark.parametrize(
    ("engine", "page", "expected"),
    [
        ("sim", VLLM_PAGE, Sample(3, 2, 0.42)),
        ("vllm", VLLM_PAGE, Sample(3, 2, 0.42)),
        ("llamacpp", LLAMACPP_PAGE, Sample(1, 4, None)),
        ("sglang", SGLANG_PAGE, Sample(5, 1, 0.8)),
        ("trtllm", TRTLLM_PAGE, Sample(2, 0, 0.1)),
    ],
)
def test_each_engine_mapping_reads_its_page(engine: str, page: str, expected: Sample) -> None:
    assert parse_metrics(page, names(engine)) == expected


def test_trtllm_is_read_at_its_prometheus_path() -> None:
    assert metric_mapping("trtllm").metrics_path == "/prometheus/metrics"


def test_llamacpp_has_no_kv_and_that_is_not_a_violation() -> None:
    result = parse_metrics(LLAMACPP_PAGE, names("llamacpp"))
    assert isinstance(result, Sample) and result.kv_usage is None and result.missing == ()


def test_a_mapped_optional_name_the_page_lacks_is_a_violation_but_still_a_sample() -> None:
    wrong = MetricNames(
        "llamacpp:requests_processing", "llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio"
    )
    result = parse_metrics(LLAMACPP_PAGE, wrong)
    assert isinstance(result, Sample)
    assert result.missing == ("llamacpp:kv_cache_usage_ratio",)
    assert (result.running, result.waiting, result.kv_usage) == (1, 4, None)


def test_missing_mandatory_metric_is_an_error_naming_it() -> None:
    page = 'vllm:num_requests_running{model_name="m"} 1\n'
    result = parse_metrics(page, names("vllm"))
    assert isinstance(result, ScrapeError)
    assert result.missing == ("vllm:num_requests_waiting",)
    assert "vllm:num_requests_waiting" in result.reason


def test_vllm_old_kv_name_is_accepted_as_an_alternative() -> None:
    page = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.3\n"
    assert parse_metrics(page, names("vllm")) == Sample(0, 0, 0.3)


def test_series_are_summed_across_ranks_and_kv_takes_the_fullest() -> None:
    page = (
        'sglang:num_running_reqs{tp_rank="0"} 2\nsglang:num_running_reqs{tp_rank="1"} 3\n'
        'sglang:num_queue_reqs{tp_rank="0"} 1\nsglang:token_usage{tp_rank="0"} 0.2\nsglang:token_usage{tp_rank="1"} 0.7\n'
    )
    assert parse_metrics(page, names("sglang")) == Sample(5, 1, 0.7)


def test_label_values_with_spaces_braces_and_quotes_parse() -> None:
    page = 'vllm:num_requests_running{model_name="a b} \\"c\\"",x="y"} 1 1700000000000\nvllm:num_requests_waiting 0\n'
    result = parse_metrics(page, MetricNames("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert result == Sample(1, 0, None)


def test_html_page_is_an_error_value() -> None:
    result = parse_metrics("<!DOCTYPE html><html><body>Login</body></html>", names("vllm"))
    assert isinstance(result, ScrapeError) and "HTML" in result.reason


@pytest.mark.parametrize("page", ["", "# only comments\n", "not a metric line at all\n", "x{ 1\n", "x abc\n"])
def test_garbage_is_an_error_value(page: str) -> None:
    assert isinstance(parse_metrics(page, names("vllm")), ScrapeError)


@given(st.text(max_size=300))
def test_never_raises_on_any_text(page: str) -> None:
    assert isinstance(parse_metrics(page, names("llamacpp")), Sample | ScrapeError)
