"""H9 (issue 35): a chat template from `tokenizer_dir` (a model publisher's code) renders bounded.

The exploits as the review sketches them, each through `PromptTokenizer.render_chat` (what the router's
precise prefix scoring calls on its event loop) and through the prefix routing that falls back to the
approximate index:

* `{{ 10 ** (10 ** 10) }}` froze the process in C for good; now the intercepted `**` refuses it at once;
* two nested `range(100000)` loops ran until killed; now the render is stopped at its deadline and the
  template is not rendered again (every later request is scored approximately, at once);
* `[1] * 10**8` allocated 800 MB; the intercepted `*` refuses it;
* a template that writes far more than the messages it was given is cut;
* jinja2's floor is 3.1.6, above the sandbox escapes CVE-2024-56326 and CVE-2025-27516 (checked with the other
  floors in test_supply_chain.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from llmgw_router.routing.prefix_routing import PrefixRouting
from llmgw_router.routing.tokenizer import MAX_RENDERED_CHARS, PromptTokenizer, TokenizerError
from router.test_prefix_tokenizer import MESSAGES, POLICY, write_model_dir

NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


def hostile(tmp_path: Path, model_dir: Path, template: str) -> Path:
    """A model directory whose tokenizer is the good one and whose chat template is `template`."""
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return tmp_path


def test_a_huge_power_is_refused_not_computed(tmp_path: Path, model_dir: Path) -> None:
    tok = PromptTokenizer.load(hostile(tmp_path, model_dir, "{{ 10 ** (10 ** 10) }}"))
    with pytest.raises(TokenizerError, match="power of more than"):
        tok.render_chat(MESSAGES)


def test_a_huge_repetition_is_refused_not_allocated(tmp_path: Path, model_dir: Path) -> None:
    tok = PromptTokenizer.load(hostile(tmp_path, model_dir, "{{ ([1] * (10 ** 8)) | length }}"))
    with pytest.raises(TokenizerError, match="repetition of more than"):
        tok.render_chat(MESSAGES)


def test_nested_loops_are_stopped_at_the_deadline_and_the_template_is_not_rendered_again(
    tmp_path: Path, model_dir: Path
) -> None:
    tok = PromptTokenizer.load(hostile(tmp_path, model_dir, NESTED))
    with pytest.raises(TokenizerError, match="longer than"):
        tok.render_chat(MESSAGES)
    with pytest.raises(TokenizerError, match="not rendered"):
        tok.render_chat(MESSAGES)  # refused at once: no second deadline spent on it


def test_an_oversized_output_is_cut(tmp_path: Path, model_dir: Path) -> None:
    template = "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}"  # 100 MB of output
    tok = PromptTokenizer.load(hostile(tmp_path, model_dir, template))
    with pytest.raises(TokenizerError, match="was cut"):
        tok.render_chat(MESSAGES)
    # a template that writes the messages out (and a little more) is not
    tok = PromptTokenizer.load(model_dir)
    long = [{"role": "user", "content": "y" * (2 * MAX_RENDERED_CHARS)}]
    assert tok.render_chat(long).count("y") == 2 * MAX_RENDERED_CHARS


def test_the_prefix_routing_of_a_hostile_template_falls_back_to_the_approximate_index(
    tmp_path: Path, model_dir: Path
) -> None:
    directory = str(hostile(tmp_path, model_dir, "{{ messages | length }}{{ 10 ** (10 ** 10) }}"))
    pr = PrefixRouting()
    for _ in range(3):
        key = pr.key({"messages": MESSAGES}, POLICY, "p", directory)
        assert key is not None and key.ids() is None and key.approx
