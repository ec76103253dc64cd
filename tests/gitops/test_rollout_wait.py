"""`llmgw apply --wait` waits for a roll: a model whose replicas are being replaced is not done, even with
every replica ready, and the progress line says it is rolling."""

from __future__ import annotations

from llmgw.cli.repo import follow


def test_a_rolling_model_keeps_apply_wait_waiting() -> None:
    rev = "sha256:abc"
    rolling = [{"model": "a", "health": "Progressing", "ready": 2, "target": 2, "rolling": True}]
    base = {"applied": {"revision": rev}, "sync": "Synced", "models": rolling}
    p = follow.progress(base, rev, was_applied=True)
    assert p.phase == "waiting"
    assert p.why == ("model a is Progressing (2/2 ready, rolling)",)
    assert "a Progressing 2/2 rolling" in p.line()
    done = [{"model": "a", "health": "Healthy", "ready": 2, "target": 2, "rolling": False}]
    assert follow.progress(base | {"models": done}, rev, was_applied=True).phase == "done"
