"""What every client test shares: the gateway they talk to (one `llmgw up` on the example repo as shipped, started
once per test session by tests/clients/conftest.py) and the marks that keep them together.

The model is the example's simulated chat model: it calls a tool when offered one and answers a tool's result in
words (llmgw_agent.sim_model.tool_call), so each client's loop runs to its end. The tests check the loop's
mechanics (a tool called with arguments that parse, its result sent back, a final answer in words, usage
reported), not what the words mean.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

# Every client test starts processes (the session's `llmgw up`, some a CLI or node), so `make test-fast` leaves
# them out; one xdist group, so one worker runs them all against one `up` instead of each worker starting its own.
# Every worker still collects every module: the test modules import their client where they use it, not at the
# top (each of these packages costs seconds of CPU to import, which the workers that run none would pay too).
CLIENT_TEST = [pytest.mark.integration, pytest.mark.xdist_group("clients")]

MODEL = "sim-chat"  # the example repo's chat model (examples/cluster-repo/models/sim.yaml)
NODE_DIR = Path(__file__).resolve().parent / "node"  # the npm clients, `make node-clients`
CITY = "Paris"


@dataclass(frozen=True)
class Gateway:
    """The running `llmgw up`: its OpenAI base URL (…/v1) and the key it printed for the example project."""

    base_url: str
    api_key: str
    model: str = MODEL

    @property
    def root_url(self) -> str:
        """The base URL without /v1: where the anthropic client appends its own /v1/messages."""
        return self.base_url.removesuffix("/v1")


def weather(city: str) -> str:
    """The tool every client is given: the weather in a city, as a JSON text the model reads back (the node
    scripts write the same text)."""
    return json.dumps({"city": city, "sky": "sunny", "celsius": 21})
