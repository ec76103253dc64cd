"""Stored responses across router processes: two `llmgw-router --store DSN --content-key-file FILE` processes
on one store, a response kept through one and retrieved, continued and deleted through the other (the key
made as an operator makes it, `openssl rand -base64 32`), with the official openai client."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from faults.procs import RouterProc, start_router_proc
from tenancy.helpers import create_key

from .helpers import SimProcess, endpoint, start_sim, wait_healthy_sync

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    proc = start_sim("sim-chat", "engine-key-t")
    try:
        wait_healthy_sync([proc])
        yield proc
    finally:
        proc.kill()


def _routers(tmp: Path, sim: SimProcess, store_dsn: str) -> list[RouterProc]:
    snap = {
        "revision": "kept-1",
        "models": {"sim-chat": {"context_length": 4096, "capabilities": ["chat"], "simulated": True}},
        "tenants": {
            "organizations": {"o": {}},
            "projects": {"keeper": {"organization": "o", "retention": {"content": True, "ttl": "1d"}}},
        },
        "endpoints": [endpoint(sim, "rep-a")],
    }
    (tmp / "snap.json").write_text(json.dumps(snap))
    key_file = tmp / "content.key"
    key_file.write_text(base64.b64encode(os.urandom(32)).decode() + "\n")
    routers: list[RouterProc] = []
    try:
        for name in ("r1", "r2"):
            args = [
                "--snapshot",
                str(tmp / "snap.json"),
                "--store",
                store_dsn,
                "--router-id",
                name,
                "--state-dir",
                str(tmp / name),
                "--content-key-file",
                str(key_file),
            ]
            routers.append(start_router_proc(tmp / f"{name}.log", args))
    except BaseException:
        for r in routers:
            r.stop()
        raise
    return routers


def test_a_response_kept_by_one_router_is_continued_and_deleted_through_another(
    tmp_path: Path, sim: SimProcess, store_dsn: str
) -> None:
    key = create_key(store_dsn, "keeper")
    r1, r2 = _routers(tmp_path, sim, store_dsn)
    try:
        with r1.client(key) as one, r2.client(key) as two:
            kept = one.responses.create(model="sim-chat", input="remember this", max_output_tokens=3)
            assert kept.store is True
            assert two.responses.retrieve(kept.id).output_text == kept.output_text
            nxt = two.responses.create(model="sim-chat", input="go on", previous_response_id=kept.id)
            assert nxt.previous_response_id == kept.id
            two.responses.delete(kept.id)
            with pytest.raises(openai.NotFoundError):
                one.responses.retrieve(kept.id)
    finally:
        for r in (r1, r2):
            assert r.stop() == 0, r.text()[-3000:]
    for r in (r1, r2):
        assert "Traceback" not in r.text(), r.text()[-3000:]


def test_a_bad_content_key_file_stops_the_router_naming_it(tmp_path: Path, sim: SimProcess) -> None:
    bad = tmp_path / "content.key"
    bad.write_text("not base64!")
    args = [
        "--snapshot",
        str(tmp_path / "snap.json"),
        "--store",
        f"sqlite:///{tmp_path / 'llmgw.db'}",
        "--content-key-file",
        str(bad),
        "--state-dir",
        str(tmp_path / "r"),
    ]
    (tmp_path / "snap.json").write_text(json.dumps({"revision": "r", "endpoints": [endpoint(sim, "rep-a")]}))
    with pytest.raises(AssertionError, match="router exited at start"):
        start_router_proc(tmp_path / "r.log", args)
    text = (tmp_path / "r.log").read_text()
    assert f"--content-key-file {bad}: the content key is not base64" in text, text[-2000:]
    assert "Traceback" not in text
