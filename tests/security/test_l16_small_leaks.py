"""L16: an `apply` token cannot fill the controller's disk with `files` payloads, and an anonymous caller of the
mirror cannot make the controller compute one HMAC per declared node for each guessed `llmgw-nt-` token.

The exploits as the review sketches them: an `apply` token POSTs `files` (up to the 32 MiB body limit) again and
again, each a new digest, each written to `STATE_DIR/applied/<digest>/` before validation and never removed; an
unauthenticated client of the mirror listener presents `llmgw-nt-<anything>`, and `mirror_reader` tries it
against every declared node's token.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from controller.test_reconcile_loop import Loop, loop  # noqa: F401  (the fixture)

from llmgw.controller.api.applied_files import KEPT, MAX_BYTES

from .test_admin_tokens import APPLY_TOKEN, Controller, _files, controller  # noqa: F401  (the fixture)

pytestmark = pytest.mark.integration


def _applied(c: Controller) -> list[Path]:
    applied = c.running.controller.settings.state_dir / "applied"
    return sorted(p for p in applied.iterdir() if p.is_dir()) if applied.exists() else []


async def test_l16_a_files_payload_over_the_cap_is_refused_before_anything_is_written(
    controller: Controller,  # noqa: F811
) -> None:
    before = _applied(controller)
    files = _files(controller.repo.path) | {"models/huge.yaml": "# " + "x" * (MAX_BYTES + 1)}
    status, body = await controller.call("POST", "/api/v1/apply", APPLY_TOKEN, {"files": files})
    assert status == 400, body
    assert f"more than {MAX_BYTES} bytes" in body["error"]["message"]
    assert _applied(controller) == before


async def test_l16_many_refused_applies_keep_a_bounded_number_of_payloads(
    controller: Controller,  # noqa: F811
) -> None:
    good = _files(controller.repo.path)
    status, body = await controller.call("POST", "/api/v1/apply", APPLY_TOKEN, {"files": good})
    assert status == 200 and body["result"] in ("applied", "unchanged"), body
    for n in range(KEPT + 12):  # each a new digest, each refused by validation
        bad = good | {"models/bad.yaml": f"apiVersion: llmgw/v1\nkind: Model\nmetadata: {{name: bad-{n}}}\n"}
        status, body = await controller.call("POST", "/api/v1/apply", APPLY_TOKEN, {"files": bad})
        assert status == 422, body
    kept = _applied(controller)
    assert len(kept) <= KEPT + 1, f"{len(kept)} payload directories kept"
    # Whatever revision serves now (the apply's payload, or the repo's directory when a poll of the repo came
    # after it), its files stay: its secret files are read from there later.
    assert controller.running.controller.desired.root.is_dir()


HMACS_PER_GUESS_BEFORE = 300  # declared nodes: one HMAC each per guess before the fix


def _nodes(n: int) -> dict[str, str | None]:
    doc = "apiVersion: llmgw/v1\nkind: Node\nmetadata: {{name: n{i}}}\nspec: {{address: 127.0.0.9}}\n"
    return {f"nodes/n{i}.yaml": doc.format(i=i) for i in range(n)}


async def test_l16_a_guessed_node_token_costs_no_hmac_per_declared_node(
    loop: Loop,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop.apply(_nodes(HMACS_PER_GUESS_BEFORE))
    c = loop.c
    real = c.node_token("n7")
    assert c.mirror_reader(real)  # a declared node's own token still reads the mirror
    assert not c.mirror_reader("llmgw-nt-" + "0" * 64)

    computed = 0
    original: Callable[..., Any] = hmac.new

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal computed
        computed += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(hmac, "new", counting)
    guesses = 50
    for i in range(guesses):
        assert not c.mirror_reader(f"llmgw-nt-{i:064x}")
    assert computed == 0, f"{computed} HMACs for {guesses} guessed tokens"
    assert c.mirror_reader(real) and computed == 1  # the one check of the node the token names
