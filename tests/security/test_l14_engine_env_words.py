"""L14: engine environment names whose effect is an address to report to, a rendezvous address, or logging and
tracing that write tenants' prompts and completions to the engine log, are refused under the tuning prefixes.

The exploit as the review sketches it: a Model author sets `VLLM_USAGE_STATS_SERVER` (vLLM posts usage reports
there), `VLLM_DEBUG_LOG_API_SERVER_RESPONSE` (every completion goes to the engine log, which is tailed to the
controller), `VLLM_LOGGING_LEVEL`, `VLLM_TRACE_FUNCTION` or `NCCL_COMM_ID` (an address). `llmgw validate`
refuses each with file:line and the field path, and the agent drops it from a ShardSpec that never went through
validate (`repo_rules.filter_env`, the same rule).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from llmgw_agent import repo_rules

from .repo_attack import GPU_PROFILE, attack_repo, model, validate

HARMFUL = {
    "VLLM_USAGE_STATS_SERVER": "SERVER",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "LOG",
    "VLLM_LOGGING_LEVEL": "LOGGING",
    "VLLM_TRACE_FUNCTION": "TRACE",
    "NCCL_COMM_ID": "ID",
}


@pytest.mark.parametrize("name", sorted(HARMFUL))
def test_l14_validate_refuses_the_name(tmp_path: Path, name: str) -> None:
    profile = GPU_PROFILE + f"      env:\n        OMP_NUM_THREADS: '4'\n        {name}: '1'\n"
    result = validate(attack_repo(tmp_path, model(profile)))
    prefix = name.split("_", 1)[0] + "_"
    result.assert_refused(
        name,
        f"spec.profiles[0].env.{name}",
        f"{name} is refused: a {prefix}* name with `{HARMFUL[name]}` in it",
    )
    assert "invalid: 1 error(s)" in result.out  # OMP_NUM_THREADS passes


def test_l14_the_agent_drops_the_names_from_a_shardspec() -> None:
    env = dict.fromkeys(HARMFUL, "1") | {"VLLM_USE_V1": "1", "NCCL_DEBUG": "WARN", "VLLM_NO_USAGE_STATS": "1"}
    kept, dropped = repo_rules.filter_env("vllm", env)
    assert dropped == sorted(HARMFUL)
    assert kept == {
        "VLLM_USE_V1": "1",
        "NCCL_DEBUG": "WARN",
        "VLLM_NO_USAGE_STATS": "1",
    }  # tuning still passes
