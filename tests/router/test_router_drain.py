"""A router stopped with SIGTERM drains: /ready says `draining` (503) first while requests are still served for
--drain-delay, so a load balancer sends new ones elsewhere; a request in flight when the signal came finishes
whole; then the process exits 0 (the control-plane upgrade restarts routers this way behind HAProxy)."""

from __future__ import annotations

import json
import signal
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest
from faults.procs import http_status, start_router_proc
from support import wait_until

from llmgw.adapters.keys import hash_key
from router.helpers import endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration

KEY = "sk-llmgw-" + "d" * 43


def _ready(url: str) -> tuple[int | None, Any]:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=3) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), json.loads(exc.read())
    except (urllib.error.URLError, OSError):
        return None, None


def test_sigterm_turns_ready_off_first_and_lets_requests_finish(tmp_path: Path) -> None:
    sim = start_sim("sim-drain", "engine-key", decode_ms=200.0)  # its 16-token answer: about 3 seconds
    try:
        wait_healthy_sync([sim])
        (tmp_path / "snapshot.json").write_text(
            json.dumps(
                {
                    "revision": "drain-1",
                    "models": {"sim-drain": {"context_length": 4096}},
                    "endpoints": [endpoint(sim, "s1")],
                }
            )
        )
        (tmp_path / "keys").write_text(f"{hash_key(KEY)} p1 key-1\n")
        given = ["--snapshot", str(tmp_path / "snapshot.json"), "--keys-file", str(tmp_path / "keys")]
        router = start_router_proc(
            tmp_path / "router.log", [*given, "--drain-delay", "2", "--drain-timeout", "30"]
        )
        client = router.client(KEY)
        assert _ready(router.api) == (200, {"status": "ready"})
        long: dict[str, Any] = {}

        def slow() -> None:
            try:
                long["text"] = client.completions.create(model="sim-drain", prompt="go", max_tokens=150)
            except openai.APIError as exc:
                long["error"] = exc

        in_flight = threading.Thread(target=slow)
        in_flight.start()
        wait_until(lambda: _in_flight(router.metrics) == 1, 10, "the long request in flight")
        router.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: _ready(router.api)[0] == 503, 5, "/ready to say draining")
        assert _ready(router.api) == (503, {"status": "draining"})
        # Still served while the balancer takes the router out.
        quick = client.completions.create(model="sim-drain", prompt="still", max_tokens=2)
        assert quick.choices
        in_flight.join(60)
        assert "error" not in long, long.get("error")
        done = long["text"]
        assert (done.choices[0].finish_reason, done.usage.completion_tokens) == ("stop", 16), "finished whole"
        assert router.proc.wait(30) == 0
        assert http_status(router.api + "/health") is None, "no longer listening"
    finally:
        sim.kill()


def _in_flight(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(
        float(line.split()[-1]) for line in lines if line.startswith("llmgw_router_endpoint_inflight{")
    )
