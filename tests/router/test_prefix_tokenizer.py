"""Precise prefix scoring of vLLM endpoints with the model's own tokenizer: a real `tokenizers` BPE trained
offline here, saved as tokenizer.json beside a tokenizer_config.json with a ChatML chat template, as a model
directory holds them. The router's ids must be the tokenizer's encoding of the rendered template, their block
hashes vLLM's (the golden algorithm, tests/router/test_prefix_hash.py), and a KV event batch built from them
must make the router score that endpoint precise with the whole prompt matched."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import msgpack
import pytest
from llmgw_router.decisions.fields import cache_salt
from llmgw_router.decisions.prefix import parse_event_batch, vllm_block_hashes
from llmgw_router.decisions.scheduler import Candidate
from llmgw_router.fleet.table import LiveEndpoint
from llmgw_router.routing.prefix_routing import PrefixRouting
from llmgw_router.routing.tokenizer import PromptTokenizer, TokenizerError

from llmgw.core.config.models import RoutingPolicySpec
from llmgw.core.snapshot import Endpoint

tokenizers = pytest.importorskip("tokenizers")

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "You are a helpful assistant that answers questions about the weather and the sea.",
    "The quick brown fox jumps over the lazy dog near the river bank every morning.",
    "Routing requests to the replica that holds their prefix saves the prefill.",
] * 20
SEED = "7"
POLICY = RoutingPolicySpec.model_validate(
    {"weights": {"prefix": 1}, "prefix": {"events_stale_after": "5s", "hash_seed": SEED}}
)
MESSAGES = [
    {"role": "system", "content": " ".join(CORPUS[:6])},
    {"role": "user", "content": "What is the weather at sea this morning?"},
]


def write_model_dir(d: Path) -> Path:
    """A model directory's tokenizer files: a byte-level BPE trained on CORPUS (BOS by its post-processor)
    and a tokenizer_config.json with a ChatML chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    )
    tok.train_from_iterator(CORPUS, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok.save(str(d / "tokenizer.json"))
    config = {"chat_template": CHATML, "bos_token": "<s>", "eos_token": {"content": "<|im_end|>"}}
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    return d


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model_dir(tmp_path_factory.mktemp("model"))


def _ep(replica: str, engine: str = "vllm", key: str = "engine-key") -> LiveEndpoint:
    spec = Endpoint(
        replica_id=replica,
        model="m",
        engine=engine,
        base_url="http://127.0.0.1:1",
        api_key=key,
        kv_events="http://127.0.0.1:2/llmgw/kv-events",
        kv_block_size=16,
    )
    return LiveEndpoint(spec, "http://127.0.0.1:1/v1", None, None, 0.0)


def _rendered() -> str:
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES) + (
        "<|im_start|>assistant\n"
    )


def test_chat_ids_are_the_tokenizers_encoding_of_the_rendered_template(model_dir: Path) -> None:
    from tokenizers import Tokenizer

    tok = PromptTokenizer.load(model_dir)
    assert tok.render_chat(MESSAGES) == _rendered()
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    ids = tok.encode_chat(MESSAGES)
    assert ids == raw.encode(_rendered(), add_special_tokens=False).ids
    assert ids[0] == raw.token_to_id("<|im_start|>")  # the template's special tokens are tokens, not text
    assert raw.token_to_id("<s>") not in ids  # no BOS added for chat: the template writes what it wants
    # completions: the post-processor's BOS, as vLLM encodes a prompt
    assert tok.encode_text("the quick brown fox") == raw.encode("the quick brown fox").ids
    assert tok.encode_text("the quick brown fox")[0] == raw.token_to_id("<s>")


def test_text_content_parts_render_as_their_texts_joined_unless_the_template_loops_over_parts(
    model_dir: Path, tmp_path: Path
) -> None:
    """vLLM's "auto" content format: a template that does not iterate a message's content gets its text parts
    joined by newlines (so the request hashes as the same text sent as a string); one that does gets them."""
    tok = PromptTokenizer.load(model_dir)
    parts = [{"type": "text", "text": "What is the weather"}, {"type": "text", "text": "at sea?"}]
    as_parts = tok.render_chat([{"role": "user", "content": parts}])
    assert as_parts == tok.render_chat([{"role": "user", "content": "What is the weather\nat sea?"}])
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    looping = (
        "{% for message in messages %}{% for part in message['content'] %}[{{ part['text'] }}]"
        "{% endfor %}{% endfor %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": looping}))
    assert PromptTokenizer.load(tmp_path).render_chat([{"role": "user", "content": parts}]) == (
        "[What is the weather][at sea?]"
    )


def test_add_bos_token_in_the_config_decides_the_completion_bos(model_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False}))
    tok = PromptTokenizer.load(tmp_path)
    bos = tok.tokenizer.token_to_id("<s>")
    assert bos not in tok.encode_text("the quick brown fox")


def test_the_template_sees_transformers_variables_and_raise_exception(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    template = (
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}\n  {{ m['content'] | tojson }}{{ eos_token }}\n{% endfor %}"
    )
    config = {
        "chat_template": [{"name": "default", "template": template}],
        "bos_token": "<s>",
        "eos_token": "</s>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = PromptTokenizer.load(tmp_path)
    # trim_blocks drops the newline after a block tag ({% endif %} here)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == '<s>  "hi"</s>\n'
    with pytest.raises(TokenizerError, match="no tools"):
        tok.render_chat([{"role": "tool", "content": "x"}])


def test_the_hashes_of_those_ids_are_vllms(model_dir: Path) -> None:
    pr = PrefixRouting()
    key = pr.key({"messages": MESSAGES}, POLICY, "p", str(model_dir))
    assert key is not None
    ids = PromptTokenizer.load(model_dir).encode_chat(MESSAGES)
    assert key.ids() == ids and len(ids) >= 64
    ep = _ep("a")
    salt = cache_salt("engine-key", "p")
    want = vllm_block_hashes(ids, 16, SEED, salt)
    assert pr._engine_hashes(ep, key, POLICY, "p") == tuple(want)
    assert pr._first_engine_hash(ep, key, POLICY, "p") == want[0]
    # the sim's endpoints of the same request still hash the sim's way
    sim = pr._engine_hashes(_ep("s", engine="sim"), key, POLICY, "p")
    assert sim and sim[0] != want[0]


def _batch(hashes: list[int], ids: list[int]) -> list[object]:
    """A KVEventBatch as vLLM's publisher msgpacks it, decoded back (tagged array-like structs)."""
    stored = ["BlockStored", hashes, None, ids[: 16 * len(hashes)], 16, None, "GPU"]
    return msgpack.unpackb(msgpack.packb([1.0, [stored], None]))  # type: ignore[no-any-return]


def test_an_event_batch_from_the_real_ids_scores_the_vllm_endpoint_precise_and_whole(model_dir: Path) -> None:
    pr = PrefixRouting()
    ids = PromptTokenizer.load(model_dir).encode_chat(MESSAGES)
    want = vllm_block_hashes(ids, 16, SEED, cache_salt("engine-key", "p"))
    _, events = parse_event_batch(_batch(want, ids))
    pr.events.apply("a", events, now=0.0)
    pr.events.apply("b", [], now=0.0)  # heard from, holds nothing
    eps = [_ep("a"), _ep("b")]
    key = pr.key({"messages": MESSAGES}, POLICY, "p", str(model_dir))
    assert key is not None
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, key, POLICY, "p", now=1.0)
    assert [(c.prefix, c.prefix_source) for c in cands] == [(1.0, "precise"), (0.0, "precise")]
    # without the tokenizer directory the same events cannot be matched: approximate scoring
    plain = pr.key({"messages": MESSAGES}, POLICY, "p")
    assert plain is not None
    cands = [Candidate(ep.id) for ep in eps]
    pr.annotate(cands, eps, plain, POLICY, "p", now=1.0)
    assert [c.prefix_source for c in cands] == ["approx", "approx"]


def test_a_tokenizer_that_cannot_load_is_one_warning_and_approximate_scoring(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pr = PrefixRouting()
    missing = str(tmp_path / "nowhere")
    eps = [_ep("a")]
    pr.events.apply("a", [], now=0.0)
    with caplog.at_level(logging.WARNING, logger="llmgw_router.routing.prefix_routing"):
        for _ in range(3):
            key = pr.key({"messages": MESSAGES}, POLICY, "p", missing)
            assert key is not None
            cands = [Candidate("a")]
            pr.annotate(cands, eps, key, POLICY, "p", now=1.0)
            pr.placed(eps[0], key, POLICY, "p", now=1.0)
            assert cands[0].prefix_source == "approx"
    warned = [r.getMessage() for r in caplog.records if "tokenizer directory" in r.getMessage()]
    assert len(warned) == 1 and missing in warned[0] and "tokenizer.json" in warned[0]


def test_a_template_that_rejects_a_request_scores_that_request_approximately(
    tmp_path: Path, model_dir: Path
) -> None:
    (tmp_path / "tokenizer.json").write_bytes((model_dir / "tokenizer.json").read_bytes())
    config = {"chat_template": "{{ raise_exception('system messages are not supported') }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    pr = PrefixRouting()
    pr.events.apply("a", [], now=0.0)
    key = pr.key({"messages": MESSAGES}, POLICY, "p", str(tmp_path))
    assert key is not None and key.ids() is None
    cands = [Candidate("a")]
    pr.annotate(cands, [_ep("a")], key, POLICY, "p", now=1.0)
    assert cands[0].prefix_source == "approx"


def test_completion_prompts_hash_the_encoded_prompt_or_the_given_ids(model_dir: Path) -> None:
    pr = PrefixRouting()
    tok = PromptTokenizer.load(model_dir)
    prompt = " ".join(CORPUS[:4])
    key = pr.key({"prompt": prompt}, POLICY, "p", str(model_dir))
    assert key is not None and key.ids() == tok.encode_text(prompt)
    given = list(range(40))
    key = pr.key({"prompt": given}, POLICY, "p", str(model_dir))
    assert key is not None and key.ids() == given


def test_the_models_tokenizer_dir_reaches_the_routers_snapshot_as_written() -> None:
    from llmgw.controller.wire.publisher import published_models
    from llmgw.core.config.models import Model
    from llmgw.core.desired.catalog import Catalog

    def model(name: str, **spec: object) -> Model:
        return Model.model_validate(
            {
                "apiVersion": "llmgw/v1",
                "kind": "Model",
                "metadata": {"name": name},
                "spec": {"context_length": 2048, "profiles": [{"name": "sim", "engine": "sim"}], **spec},
            }
        )

    cat = Catalog.build([model("with", tokenizer_dir="/srv/tokenizers/qwen"), model("without")])
    published = published_models(cat)
    assert published["with"].tokenizer_dir == "/srv/tokenizers/qwen"
    assert published["without"].tokenizer_dir is None
