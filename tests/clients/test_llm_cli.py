"""The `llm` CLI against `llmgw up`, as its docs set up an OpenAI-compatible server: a model entry in
extra-openai-models.yaml (under a per-test LLM_USER_PATH), the key stored with `llm keys set`, then a prompt with a
Python function as a tool (`--functions`), streamed (the default) and not (`--no-stream`). What happened is read
back from `llm logs --json`, the CLI's own record of each request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from clients.gateway import CLIENT_TEST, Gateway, weather

pytestmark = CLIENT_TEST

LLM = Path(sys.executable).parent / "llm"  # the console script of the locked `llm`, beside this Python
MODEL_ID = "llmgw-sim"
FUNCTIONS = f'''
def get_weather(city: str) -> str:
    """The weather in a city now."""
    return {weather("CITY")!r}.replace("CITY", city)
'''


def llm(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert LLM.is_file(), f"{LLM} is missing: the lock's `clients` group installs it (`make env`)"
    env = {**os.environ, "LLM_USER_PATH": str(home)}
    env.pop("OPENAI_API_KEY", None)  # the key must come from the CLI's own store
    done = subprocess.run(
        [str(LLM), *args], env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"llm {' '.join(args[:3])} exited {done.returncode}: {done.stderr}"
    return done


@pytest.fixture
def llm_home(gateway: Gateway, tmp_path: Path) -> Path:
    """The CLI's home (LLM_USER_PATH) of this test: the model entry, and the key as `llm keys set` stores it."""
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(
        f"- model_id: {MODEL_ID}\n"
        f"  model_name: {gateway.model}\n"
        f"  api_base: {gateway.base_url}\n"
        "  api_key_name: llmgw\n"
        "  supports_tools: true\n",
        encoding="utf-8",
    )
    llm(home, "keys", "set", "llmgw", stdin=gateway.api_key + "\n")
    return home


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "no-stream"])
def test_prompt_with_a_function_runs_the_tool_and_answers(llm_home: Path, stream: bool) -> None:
    flags = [] if stream else ["--no-stream"]
    done = llm(llm_home, "-m", MODEL_ID, "--functions", FUNCTIONS, *flags, "The weather in Paris?")
    answer = done.stdout.strip()
    assert answer, done.stderr

    # Everything this home logged (-n 0): the chain's two requests, one conversation.
    logs: list[dict[str, Any]] = json.loads(llm(llm_home, "logs", "-n", "0", "--json").stdout)
    asked, answered = sorted(logs, key=lambda r: r["datetime_utc"])
    assert asked["conversation_id"] == answered["conversation_id"], logs
    (call,) = asked["tool_calls"]
    assert call["name"] == "get_weather" and isinstance(call["arguments"]["city"], str), call
    (result,) = answered["tool_results"]
    assert result["tool_call_id"] == call["tool_call_id"], (call, result)
    assert result["output"] == weather(call["arguments"]["city"]) and result["exception"] is None
    assert answered["response"].strip() == answer
    for record in (asked, answered):
        assert record["input_tokens"] > 0 and record["output_tokens"] > 0, record
