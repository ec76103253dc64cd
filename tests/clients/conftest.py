"""One `llmgw up` for the whole client suite: examples/cluster-repo as shipped (not copied, not edited), on ports
and engine ports of this worker's own, its state in a temporary directory, sims only (`--no-llamacpp`: no test
here talks to gemma, and loading it would cost a minute of the two cores), stopped at the end of the session."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from e2e.up_process import Up, printed
from support import free_port, free_port_range, wait_until

from clients.gateway import MODEL, Gateway

READY_S = 120.0  # every sim replica started and the router told (about 10 s on an idle machine)
ENGINE_PORTS = 20  # the example's sims at their scaling maximum (4 + 2 + 1 + ...), with room to spare


def answers_chat(gateway: Gateway) -> bool:
    """Whether a plain chat request through the router gets its answer (the router may learn of the replicas a
    moment after the controller printed them Healthy)."""
    body = json.dumps({"model": gateway.model, "messages": [{"role": "user", "content": "ready?"}]}).encode()
    request = urllib.request.Request(
        gateway.base_url + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {gateway.api_key}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return bool(answer.status == 200)
    except urllib.error.HTTPError as refused:
        if refused.code in (401, 403):  # waiting would not change the key
            raise AssertionError(f"the printed key was refused: {refused.code} {refused.read()!r}") from None
        return False  # 503 and friends: no replica ready yet


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    names = ("router", "router_metrics", "controller", "controller_metrics")
    first = free_port_range(ENGINE_PORTS)
    run = Up(
        tmp_path_factory.mktemp("clients-up"),
        {name: free_port() for name in names},
        llamacpp=False,
        engine_ports=f"{first}-{first + ENGINE_PORTS - 1}",
    )
    run.start()
    try:
        shown = printed(run)
        run.printed(rf"model {MODEL}: Healthy", READY_S, f"{MODEL} Healthy")
        found = Gateway(shown.base_url, shown.key)
        wait_until(lambda: answers_chat(found), READY_S, f"a chat answer from {MODEL} through the router")
        yield found
    finally:
        run.kill_everything()
