"""A model's own tokenizer, so the router can hash a prompt's blocks as a real vLLM (or SGLang) replica does.

`PromptTokenizer.load(directory)` reads a Hugging Face model directory: `tokenizer.json` through the
`tokenizers` package (what transformers' fast tokenizers, and so vLLM, run) and `tokenizer_config.json` for the
chat template and the special tokens. `encode_chat` renders the chat template as transformers'
`apply_chat_template` does (a sandboxed jinja2 environment, trim_blocks and lstrip_blocks,
`add_generation_prompt=True`) and encodes the text with no special tokens added, as vLLM does for
/v1/chat/completions; `encode_text` encodes a completion's prompt with the special tokens the tokenizer adds
(its post-processor, or `add_bos_token` / `add_eos_token` where the config names them, as transformers'
Llama-family tokenizers rebuild it), as vLLM does for /v1/completions.

A GGUF model has no tokenizer.json: `load` given a `.gguf` file builds the tokenizer from the file's own
vocabulary (its `tokenizer.ggml.*` metadata and chat template) with transformers' GGUF tokenizer converter,
as vLLM does for a GGUF model (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`); the metadata is read
with the `gguf` package, because transformers' own GGUF reader needs torch. That needs the optional
`gguf` extra (`gguf`, `transformers`) and takes seconds (a 262k-token vocabulary: ~15 s niced here).

`tokenizers` and `jinja2` are imported on first load only: a router with no tokenizer directory never loads
them.

A chat template is a third party's code (whoever published the model's files), so it renders bounded
(security review H9): in jinja2's immutable sandbox, with `**` and `*` intercepted so no operand grows
past a bound (big-integer arithmetic in C holds the GIL and cannot be interrupted), its output cut at
MAX_RENDERED_CHARS plus twice the messages' own size, and in a worker thread with RENDER_DEADLINE_S. A
template that overruns its deadline is stopped and never rendered again: its model is scored from the
approximate prefix index, as for any template that fails.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import json
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from llmgw.core.errors import LlmgwError

__all__ = ["PromptTokenizer", "TokenizerError"]


class TokenizerError(LlmgwError):
    """The directory holds no usable tokenizer (missing or unreadable files, a template that fails)."""


# How long one render may take; how much it may write beyond twice the messages' size; the largest result of a
# `*` (items or characters, as the sandbox caps `range`) and of a `**` (bits) a template may compute.
RENDER_DEADLINE_S = 1.0
MAX_RENDERED_CHARS = 1 << 20
_MAX_ITEMS = 100_000
_MAX_BITS = 4096


class _RenderStopped(LlmgwError):
    """Raised inside a render thread that overran its deadline (a template has no way to catch it)."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json names it: a string, or an AddedToken dict with `content`."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _chat_template(config: dict[str, Any], directory: Path) -> str | None:
    """The default chat template: `chat_template.jinja` (newer transformers), else the config's
    `chat_template` (a string, or a list of named templates of which `default` is used)."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    found = config.get("chat_template")
    if isinstance(found, str):
        return found
    if isinstance(found, list):
        named = {t.get("name"): t.get("template") for t in found if isinstance(t, dict)}
        default = named.get("default")
        return default if isinstance(default, str) else None
    return None


@dataclass(slots=True)
class PromptTokenizer:
    directory: Path
    tokenizer: Any  # tokenizers.Tokenizer
    chat_template: str | None
    special: dict[str, str]  # bos_token, eos_token, ... as the template sees them
    add_bos: bool | None  # None: the post-processor decides
    add_eos: bool | None
    _template: Any = None  # the compiled jinja2 template, on first use
    _content_parts: bool | None = None  # whether the template iterates a message's content parts
    _worker: concurrent.futures.ThreadPoolExecutor | None = None  # renders, one at a time
    _stopped: str | None = None  # why the template is no longer rendered (it overran its deadline)

    @classmethod
    def load(cls, directory: str | Path) -> PromptTokenizer:
        """A model directory's tokenizer files, or a `.gguf` file's vocabulary. Raises TokenizerError naming
        what is wrong."""
        path = Path(directory)
        if path.suffix == ".gguf":
            return cls._from_gguf(path)
        try:
            from tokenizers import Tokenizer
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise TokenizerError(f"the tokenizers package is not installed: {e}") from e
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:
            raise TokenizerError(f"{path / 'tokenizer.json'}: {e}") from e
        config: dict[str, Any] = {}
        config_path = path / "tokenizer_config.json"
        if config_path.is_file():
            try:
                loaded = json.loads(config_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise TokenizerError(f"{config_path}: {e}") from e
            if isinstance(loaded, dict):
                config = loaded
        special = {
            name: text
            for name in (
                "bos_token",
                "eos_token",
                "unk_token",
                "pad_token",
                "sep_token",
                "cls_token",
                "mask_token",
            )
            if (text := _token_text(config.get(name))) is not None
        }
        add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
        return cls(
            path,
            tokenizer,
            _chat_template(config, path),
            special,
            add_bos if isinstance(add_bos, bool) else None,
            add_eos if isinstance(add_eos, bool) else None,
        )

    @classmethod
    def _from_gguf(cls, path: Path) -> PromptTokenizer:
        try:
            from gguf import GGUFReader
            from transformers.integrations.gguf.gguf_tokenizer_mapping import (
                GGUF_TOKENIZER_MAPPING,
                convert_gguf_tokenizer,
            )
        except ImportError as e:
            raise TokenizerError(
                f"{path}: a GGUF's vocabulary needs the gguf and transformers packages (llmgw-router[gguf]): {e}"
            ) from e
        try:
            fields = GGUFReader(str(path)).fields
            meta = {k: _gguf_value(f) for k, f in fields.items() if k.startswith("tokenizer.")}
            arch = _gguf_value(fields["general.architecture"])
            grouped = {
                group: {
                    name: meta[f"tokenizer.{key}"]
                    for key, name in renames.items()
                    if f"tokenizer.{key}" in meta
                }
                for group, renames in GGUF_TOKENIZER_MAPPING.items()
            }
            vocab, config = grouped["tokenizer"], grouped["tokenizer_config"]
            if (
                vocab.get("tokenizer_type") == "llama"
            ):  # as transformers: llama.cpp's default for sentencepiece
                config.setdefault("add_bos_token", True)
            tokenizer, _ = convert_gguf_tokenizer(arch, vocab)
        except Exception as e:
            raise TokenizerError(f"{path}: GGUF vocabulary: {e!r}") from e
        tokens = vocab.get("tokens") or []
        special = {}
        for name, key in _GGUF_SPECIAL.items():
            index = meta.get(f"tokenizer.ggml.{key}")
            if isinstance(index, int) and 0 <= index < len(tokens):
                special[name] = str(tokens[index])
        template = config.get("chat_template")
        add_bos, add_eos = config.get("add_bos_token"), config.get("add_eos_token")
        return cls(
            path,
            tokenizer,
            template if isinstance(template, str) else None,
            special,
            bool(add_bos) if add_bos is not None else None,
            bool(add_eos) if add_eos is not None else None,
        )

    def render_chat(self, messages: Sequence[Any]) -> str:
        """The prompt text the chat template renders, as `apply_chat_template(..., tokenize=False,
        add_generation_prompt=True)` does. Raises TokenizerError when there is no template or it fails."""
        if self.chat_template is None:
            raise TokenizerError(f"{self.directory}: no chat_template in tokenizer_config.json")
        if self._stopped is not None:
            raise TokenizerError(f"{self.directory}: chat template: {self._stopped}")
        if self._worker is None:
            self._worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="llmgw-chat-template")
        running: list[int] = []
        job = self._worker.submit(self._render, messages, running)
        try:
            return job.result(RENDER_DEADLINE_S)
        except concurrent.futures.TimeoutError:
            self._stopped = (
                f"not rendered: a render took longer than {RENDER_DEADLINE_S:g} s, and it was stopped"
            )
            if not job.cancel() and running:
                _interrupt(running[0])
            self._worker.shutdown(wait=False)
            raise TokenizerError(f"{self.directory}: chat template: {self._stopped}") from None

    def _render(self, messages: Sequence[Any], running: list[int]) -> str:
        """The render itself, in the worker thread (`running` gets its id, for a stop at the deadline)."""
        running.append(threading.get_ident())
        assert self.chat_template is not None
        try:
            if self._template is None:
                self._template = _compile(self.chat_template)
            if self._content_parts is None:
                self._content_parts = _iterates_content(self.chat_template)
            shown = list(messages) if self._content_parts else [_flattened(m) for m in messages]
            limit = MAX_RENDERED_CHARS + 2 * _text_size(shown)
            pieces, written = [], 0
            for piece in self._template.generate(messages=shown, add_generation_prompt=True, **self.special):
                written += len(piece)
                if written > limit:
                    raise TokenizerError(f"the rendered prompt passed {limit} characters and was cut")
                pieces.append(piece)
            return "".join(pieces)
        except TokenizerError as e:
            raise TokenizerError(f"{self.directory}: chat template: {e}") from e
        except Exception as e:  # the template's own raise_exception, an undefined name, a compile error
            raise TokenizerError(f"{self.directory}: chat template: {e}") from e

    def encode_chat(self, messages: Sequence[Any]) -> list[int]:
        """The token ids vLLM computes for a chat request: the rendered template, no special tokens added
        (the template writes them)."""
        return list(self.tokenizer.encode(self.render_chat(messages), add_special_tokens=False).ids)

    def encode_text(self, prompt: str) -> list[int]:
        """The token ids vLLM computes for a completion's prompt: special tokens added."""
        if self.add_bos is None and self.add_eos is None:
            return list(self.tokenizer.encode(prompt, add_special_tokens=True).ids)
        ids = list(self.tokenizer.encode(prompt, add_special_tokens=False).ids)
        if self.add_bos and (bos := self._id("bos_token")) is not None:
            ids.insert(0, bos)
        if self.add_eos and (eos := self._id("eos_token")) is not None:
            ids.append(eos)
        return ids

    def _id(self, name: str) -> int | None:
        text = self.special.get(name)
        found = None if text is None else self.tokenizer.token_to_id(text)
        return found if isinstance(found, int) else None


_GGUF_SPECIAL = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}


def _gguf_value(f: Any) -> Any:
    """A GGUF metadata field's value as Python: a string, a number, or a list of either."""
    from gguf import GGUFValueType

    if f.types and f.types[0] == GGUFValueType.ARRAY:
        if f.types[-1] == GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8", "replace") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types and f.types[0] == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


# A template that loops over a message's content (`for part in message['content']`) takes OpenAI content parts
# as they are; any other is given each message's text parts joined by newlines, as vLLM's "auto" content format
# decides for a text-only request (vLLM inspects the template's syntax tree; this reads its source).
_CONTENT_LOOP = re.compile(r"\{%-?\s*for\s+\w+\s+in\s+\w+(?:\[['\"]content['\"]\]|\.content)")


def _iterates_content(template: str) -> bool:
    return _CONTENT_LOOP.search(template) is not None


def _flattened(message: Any) -> Any:
    """A message whose content is a list of text parts, with those texts joined by newlines (vLLM's "string"
    content format); any other message as it is (a non-text part: the template sees what vLLM would not
    render the same, and the request's ids simply match nothing)."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if not isinstance(content, list):
        return message
    texts = [
        p["text"]
        for p in content
        if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
    ]
    if len(texts) != len(content):
        return message
    return {**message, "content": "\n".join(texts)}


def _text_size(value: Any) -> int:
    """The characters of the strings in the messages (what a template legitimately writes out again)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_text_size(v) for v in value.values())
    if isinstance(value, list | tuple):
        return sum(_text_size(v) for v in value)
    return 0


def _interrupt(thread_id: int) -> None:
    """Raise _RenderStopped in a render thread (at its next bytecode: a template's loop, not a C call, which
    the intercepted operators keep short)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_RenderStopped))


def _bounded_operands(operator: str, left: Any, right: Any) -> str | None:
    """Why `left operator right` would compute something too large to allow, or None."""
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**":
        if ints and abs(left) > 1 and right > 0 and abs(left).bit_length() * right > _MAX_BITS:
            return f"a power of more than {_MAX_BITS} bits"
        return None
    if ints:
        too_long = abs(left).bit_length() + abs(right).bit_length() > _MAX_BITS
        return f"a product of more than {_MAX_BITS} bits" if too_long else None
    for count, seq in ((left, right), (right, left)):
        if isinstance(count, int) and hasattr(seq, "__len__") and count * len(seq) > _MAX_ITEMS:
            return f"a repetition of more than {_MAX_ITEMS} items"
    return None


def _compile(source: str) -> Any:
    """The template in the environment transformers renders chat templates in, with `**` and `*` bounded."""
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"**", "*"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            why = _bounded_operands(operator, left, right)
            if why is not None:
                raise SecurityError(f"the template computes {why}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(source)
