"""A GGUF model's vocabulary as the router's tokenizer: the ids `PromptTokenizer.load(file.gguf)` computes
(transformers' GGUF tokenizer converter, as vLLM builds a GGUF model's tokenizer) must be the ids a real
llama-server computes from the same file (`POST /tokenize`), for plain text, odd whitespace, non-ASCII and
the chat template's control tokens. And the router builds that tokenizer in a thread: requests until it is
ready are scored approximately, never held, and then precisely."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from fixtures.llama import LlamaServer
from llmgw_router.routing.prefix_routing import PrefixRouting
from llmgw_router.routing.tokenizer import PromptTokenizer, TokenizerError

from llmgw.core.config.models import RoutingPolicySpec

pytestmark = [pytest.mark.integration, pytest.mark.llamacpp]

pytest.importorskip("gguf")
pytest.importorskip("transformers")

PROMPTS = [
    "Hello world, this is a test.",
    "  two  spaces\nand a newline\n\n\ttab",
    "Grüße aus Zürich: 東京 🚀 ¿qué?",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "def f(x):\n    return x ** 2  # squares",
]


def llama_tokenize(server: LlamaServer, text: str, add_special: bool) -> list[int]:
    body = json.dumps({"content": text, "add_special": add_special, "parse_special": True}).encode()
    req = urllib.request.Request(
        server.base + "/tokenize",
        body,
        {"Content-Type": "application/json", "Authorization": f"Bearer {server.key}"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return list(json.load(r)["tokens"])


@pytest.fixture(scope="module")
def gguf_tokenizer(llama_server: LlamaServer) -> PromptTokenizer:
    return PromptTokenizer.load(llama_server.model)


def test_the_gguf_vocabulary_tokenizes_as_llama_server(
    llama_server: LlamaServer, gguf_tokenizer: PromptTokenizer
) -> None:
    for text in PROMPTS:
        ids = gguf_tokenizer.tokenizer.encode(text, add_special_tokens=False).ids
        assert ids == llama_tokenize(llama_server, text, False), text
        # a completion's prompt: the BOS the file asks for (add_bos_token), as llama-server adds it
        assert gguf_tokenizer.encode_text(text) == llama_tokenize(llama_server, text, True), text


def test_a_gguf_without_a_chat_template_refuses_chat_as_vllm_would(gguf_tokenizer: PromptTokenizer) -> None:
    # this gemma file carries no tokenizer.chat_template (llama-server falls back to its own chatml): vLLM,
    # without --chat-template, refuses chat for it; the router scores such chat requests approximately
    assert gguf_tokenizer.chat_template is None
    with pytest.raises(TokenizerError, match="no chat_template"):
        gguf_tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert gguf_tokenizer.special["bos_token"] == "<bos>" and gguf_tokenizer.add_bos is True


def test_the_router_builds_a_gguf_tokenizer_in_a_thread_and_scores_approximately_meanwhile(
    llama_server: LlamaServer,
) -> None:
    policy = RoutingPolicySpec.model_validate({"weights": {"prefix": 1}})
    pr = PrefixRouting()
    prompt = "Once upon a time " * 20
    body = {"prompt": prompt}
    first = pr.key(body, policy, "p", llama_server.model)
    assert first is not None and first.ids() is None  # not built yet: this request is not held for it
    deadline = time.monotonic() + 120
    while pr.tokenizer(llama_server.model) is None:
        assert time.monotonic() < deadline, "the GGUF tokenizer was not built in 120 s"
        time.sleep(0.2)
    later = pr.key(body, policy, "p", llama_server.model)
    assert later is not None and later.ids() == llama_tokenize(llama_server, prompt, True)
    chat = pr.key({"messages": [{"role": "user", "content": prompt}]}, policy, "p", llama_server.model)
    assert chat is not None and chat.ids() is None  # no chat template in the file: approximate
