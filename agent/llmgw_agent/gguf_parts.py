"""Which file of a model directory llama-server is given: the one definition `llmgw validate` (over a repo
manifest) and the agent (over the fetched directory) both apply. Pure.

A directory holds one GGUF model, whole (`model.gguf`) or split by `llama-gguf-split` into
`NAME-00001-of-0000N.gguf` ... `NAME-0000N-of-0000N.gguf`. llama-server is given the first part and loads the
rest from beside it, so every part must be there. A multimodal projector (`mmproj*.gguf`) is not the model.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

__all__ = ["GgufEntry", "gguf_entry", "split_part_name"]

# llama.cpp's split naming (`llama_split_path`: "%s-%05d-of-%05d.gguf"): part numbers count from 1.
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<part>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


def split_part_name(prefix: str, part: int, total: int) -> str:
    """The name llama.cpp gives part `part` (from 1) of `total` of a split GGUF `prefix`."""
    return f"{prefix}-{part:05d}-of-{total:05d}.gguf"


@dataclass(frozen=True)
class GgufEntry:
    """The file (relative path inside the directory) llama-server is given, or why there is none."""

    path: str | None
    problem: str | None = None


def _model_files(names: Iterable[str]) -> list[str]:
    return sorted(
        n
        for n in names
        if n.lower().endswith(".gguf") and not PurePosixPath(n).name.lower().startswith("mmproj")
    )


def gguf_entry(names: Iterable[str]) -> GgufEntry:
    """The GGUF llama-server loads from a directory holding the files `names` (relative paths): its single
    whole GGUF, or part 1 of its one complete split set; otherwise the problem in words."""
    ggufs = _model_files(names)
    if not ggufs:
        return GgufEntry(None, "the directory holds no .gguf file (llama.cpp loads only GGUF)")
    whole = [n for n in ggufs if not _SPLIT.match(PurePosixPath(n).name)]
    sets: dict[tuple[str, int], set[int]] = {}
    for name in ggufs:
        m = _SPLIT.match(PurePosixPath(name).name)
        if m:
            prefix = str(PurePosixPath(name).parent / m["prefix"]).removeprefix("./")
            sets.setdefault((prefix, int(m["total"])), set()).add(int(m["part"]))
    models = whole + [f"{prefix} (split in {total})" for prefix, total in sorted(sets)]
    if len(models) > 1:
        return GgufEntry(
            None,
            f"the directory holds {len(models)} GGUF models ({', '.join(models)}); llama.cpp is given one: "
            "keep one model per directory (a manifest may list only its files)",
        )
    if whole:
        return GgufEntry(whole[0])
    (prefix, total), parts = next(iter(sets.items()))
    missing = [split_part_name(prefix, p, total) for p in range(1, total + 1) if p not in parts]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        return GgufEntry(None, f"the split GGUF {prefix} is incomplete: {shown} missing of {total} parts")
    return GgufEntry(split_part_name(prefix, 1, total))
