"""The sim engine's /metrics page (Prometheus text): the families vLLM publishes, under vLLM's names."""

from __future__ import annotations

from typing import Protocol

from llmgw_agent.sim_model import LatencyConfig, PrefixCache
from llmgw_agent.sim_parts import FifoSlots, SimStats
from llmgw_agent.sim_pd import Disaggregation

__all__ = ["MetricsSource", "render_metrics"]


class MetricsSource(Protocol):
    """What the page reads of a sim engine (sim.SimEngine is one)."""

    model: str
    stats: SimStats
    cfg: LatencyConfig
    slots: FifoSlots
    cache: PrefixCache
    pd: Disaggregation


def render_metrics(engine: MetricsSource) -> str:
    """The engine's /metrics page: vLLM's names for what vLLM reports, and the sim's own P/D counts."""
    labels = f'model_name="{engine.model}",engine="0"'
    s = engine.stats
    kv = min(s.kv_tokens / engine.cfg.kv_capacity_tokens, 1.0) if engine.cfg.kv_capacity_tokens else 0.0
    lines: list[str] = []

    def family(name: str, kind: str, help_: str, value: float) -> None:
        lines.extend([f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name}{{{labels}}} {value!r}"])

    family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", s.running)
    family(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        engine.slots.waiting,
    )
    family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", float(kv))
    family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", s.prompt_tokens)
    family("vllm:generation_tokens_total", "counter", "Number of generation tokens.", s.generation_tokens)
    family(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in tokens.",
        engine.cache.queries_tokens,
    )
    family(
        "vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in tokens.", engine.cache.hits_tokens
    )
    family("vllm:request_success_total", "counter", "Count of finished requests.", s.requests_finished)
    lines += s.ttft_histogram(labels)
    lines += engine.pd.metric_lines(labels)
    return "\n".join(lines) + "\n"
