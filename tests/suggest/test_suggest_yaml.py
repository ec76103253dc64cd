"""`plan --suggest --write`'s edit (issue 50): only the edited Model document goes through ruamel's round trip,
its comments, flow and block styles, quoting and indentation kept; the others stay byte for byte; a file that
changed since it was read is refused, not guessed at."""

from __future__ import annotations

import re

import pytest

from llmgw.core.suggest.yaml_edit import ModelEdit, SuggestEditError, edit_models, unified

FILE = """\
# Two models in one file: this comment stays.
apiVersion: llmgw/v1
kind: Model
metadata: {name: chat}   # inline comment
spec:
  context_length: 4096
  scaling: {min: 1, max: 2}  # bounds
  profiles:
    # the fast card first
    - {name: h100, engine: vllm, gpu_class: "h100-80g", gpus: 1}
    - name: l4
      engine: vllm   # the cheap card
      gpu_class: 'l4-24g'
---
apiVersion: llmgw/v1
kind: Model
metadata:
    name: embed
spec:
    context_length: 512
    profiles:
    -   name: cpu
        engine: llamacpp
"""


def test_the_edited_document_keeps_its_comments_and_the_other_stays_byte_for_byte() -> None:
    after = edit_models(FILE, [ModelEdit(0, "chat", "l4", 2, 6)], "m.yaml")
    first, second = after.split("---\n")
    assert second == FILE.split("---\n")[1]
    assert first == (
        "# Two models in one file: this comment stays.\n"
        "apiVersion: llmgw/v1\n"
        "kind: Model\n"
        "metadata: {name: chat}   # inline comment\n"
        "spec:\n"
        "  context_length: 4096\n"
        "  scaling: {min: 2, max: 6}  # bounds\n"
        "  profiles:\n"
        "    # the fast card first\n"
        "    - name: l4\n"
        "      engine: vllm   # the cheap card\n"
        "      gpu_class: 'l4-24g'\n"
        '    - {name: h100, engine: vllm, gpu_class: "h100-80g", gpus: 1}\n'
    )
    diff = unified("m.yaml", FILE, after)
    assert diff.startswith("--- a/m.yaml\n+++ b/m.yaml\n")
    assert "-  scaling: {min: 1, max: 2}  # bounds\n+  scaling: {min: 2, max: 6}  # bounds\n" in diff


def test_a_model_without_scaling_gets_it_before_its_profiles_in_its_own_indentation() -> None:
    after = edit_models(FILE, [ModelEdit(1, "embed", "cpu", 1, 3)], "m.yaml")
    assert after.split("---\n")[0] == FILE.split("---\n")[0]
    assert after.split("---\n")[1] == (
        "apiVersion: llmgw/v1\n"
        "kind: Model\n"
        "metadata:\n"
        "    name: embed\n"
        "spec:\n"
        "    context_length: 512\n"
        "    scaling: {min: 1, max: 3}\n"
        "    profiles:\n"
        "    -   name: cpu\n"
        "        engine: llamacpp\n"
    )


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (ModelEdit(0, "embed", "cpu", 1, 2), "document 0 is Model chat, not embed"),
        (ModelEdit(2, "chat", "l4", 1, 2), "no document 2 (it holds 2)"),
        (ModelEdit(0, "chat", "a100", 1, 2), "Model chat has no profile a100"),
    ],
)
def test_a_file_that_changed_since_it_was_read_is_refused(edit: ModelEdit, words: str) -> None:
    with pytest.raises(SuggestEditError, match=re.escape(words)):
        edit_models(FILE, [edit], "m.yaml")
