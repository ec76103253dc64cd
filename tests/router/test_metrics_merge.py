"""The merge of workers' metrics pages (llmgw_router.metrics_merge): counters summed, gauges by meaning, a
replaced worker's counts carried, a silent worker's gauges left out."""

from __future__ import annotations

from llmgw_router.metrics_merge import Merger, parse_page


def page(requests: float, queue: float, running: float, connected: float, created: float) -> str:
    return f"""# HELP llmgw_router_requests_total Requests answered
# TYPE llmgw_router_requests_total counter
llmgw_router_requests_total{{model="m",status="200",code=""}} {requests}
llmgw_router_requests_created{{model="m",status="200",code=""}} {created}
# HELP llmgw_router_admission_queue_depth Requests waiting
# TYPE llmgw_router_admission_queue_depth gauge
llmgw_router_admission_queue_depth {queue}
# HELP llmgw_router_endpoint_running Running requests the engine reported
# TYPE llmgw_router_endpoint_running gauge
llmgw_router_endpoint_running{{endpoint="e",model="m"}} {running}
# HELP llmgw_router_controller_connected 1 while connected
# TYPE llmgw_router_controller_connected gauge
llmgw_router_controller_connected {connected}
"""


def values(text: bytes) -> dict[str, float]:
    out = {}
    for line in text.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def test_counters_sum_and_gauges_merge_by_meaning() -> None:
    merged = values(Merger().merge([parse_page(page(3, 1, 5, 1, 100)), parse_page(page(4, 2, 7, 0, 90))]))
    assert merged["llmgw_router_requests_total"] == 7
    assert merged["llmgw_router_requests_created"] == 90  # the oldest series' start
    assert merged["llmgw_router_admission_queue_depth"] == 3  # waiting in either worker: summed
    assert merged["llmgw_router_endpoint_running"] == 7  # one engine read twice: the largest reading
    assert merged["llmgw_router_controller_connected"] == 0  # connected only if every worker is


def test_a_replaced_worker_keeps_its_counts_and_a_silent_one_its_counters_only() -> None:
    merger = Merger()
    old = parse_page(page(10, 1, 5, 1, 100))
    merger.retire(old)  # it died; its successor starts from zero
    fresh = parse_page(page(2, 0, 5, 1, 200))
    silent = parse_page(page(6, 4, 9, 1, 100))  # did not answer this scrape: its last page
    merged = values(merger.merge([fresh], [silent]))
    assert merged["llmgw_router_requests_total"] == 10 + 2 + 6  # never backwards
    assert merged["llmgw_router_admission_queue_depth"] == 0  # the silent worker's gauges are unknown
    assert merged["llmgw_router_endpoint_running"] == 5
