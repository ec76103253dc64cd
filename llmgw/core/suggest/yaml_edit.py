"""The suggestion as a change to the repo: a Model's `scaling.min`/`scaling.max` set and its chosen profile put
first (placement takes profiles in order), edited through ruamel's round trip so comments, key order, flow or
block style and quoting stay as written. Pure: text in, text out; `unified` makes the diff the PR comment shows.
"""

from __future__ import annotations

import difflib
import io
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

from llmgw.core.errors import LlmgwError

__all__ = ["ModelEdit", "SuggestEditError", "edit_models", "unified"]


class SuggestEditError(LlmgwError):
    """The file does not hold the Model where, or as, the repo's loader read it: it changed since."""


@dataclass(frozen=True, slots=True)
class ModelEdit:
    index: int  # the document's position in its file, from 0
    name: str  # the Model's metadata.name, checked before editing
    profile: str
    min: int
    max: int


def _guess_indent(text: str) -> tuple[int, int, int]:
    """(mapping indent, block sequence indent, its dash's offset) as the document writes them: the first key
    nested under a `key:` line, the first `- ` item under one (where its dash and its content stand)."""
    indent = sequence = offset = None
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for parent, child in itertools.pairwise(lines):
        if not parent.rstrip().endswith(":"):
            continue
        dash = len(child) - len(child.lstrip())
        base = len(parent) - len(parent.lstrip().lstrip("- "))
        if child.lstrip().startswith("- ") and offset is None:
            item = child[dash + 1 :]
            offset, sequence = dash - base, dash + 1 + len(item) - len(item.lstrip()) - base
        elif not child.lstrip().startswith("- ") and dash > base and indent is None:
            indent = dash - base
    offset = max(0, offset or 0)
    return indent or 2, max(sequence or 0, offset + 2), offset


def _yaml(text: str) -> YAML:
    indent, sequence, offset = _guess_indent(text)
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 4096  # never re-wrap a long line
    yaml.indent(mapping=indent, sequence=sequence, offset=offset)
    yaml.explicit_start = text.lstrip().startswith("---")
    return yaml


_SEPARATOR = re.compile(r"^---(\s|$)", re.MULTILINE)


def _documents(text: str) -> list[str]:
    """The file cut before each `---` line: each piece one document's text, kept byte for byte."""
    starts = [m.start() for m in _SEPARATOR.finditer(text)]
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    pieces = [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]
    # A file that opens with comments then `---` holds its first document after the separator.
    if len(pieces) > 1 and not _SEPARATOR.match(pieces[0]) and not _has_content(pieces[0]):
        pieces[1] = pieces[0] + pieces[1]
        pieces.pop(0)
    return pieces


def _has_content(piece: str) -> bool:
    return any(line.strip() and not line.lstrip().startswith("#") for line in piece.splitlines())


def _edit(doc: Any, edit: ModelEdit, file: str) -> None:
    if not isinstance(doc, CommentedMap) or doc.get("kind") != "Model":
        raise SuggestEditError(f"{file}: document {edit.index} is not a Model")
    name = (doc.get("metadata") or {}).get("name")
    spec = doc.get("spec")
    if name != edit.name or not isinstance(spec, CommentedMap):
        raise SuggestEditError(f"{file}: document {edit.index} is Model {name}, not {edit.name}")
    scaling = spec.get("scaling")
    if isinstance(scaling, CommentedMap):
        scaling["min"] = edit.min
        scaling["max"] = edit.max
    else:
        block = CommentedMap([("min", edit.min), ("max", edit.max)])
        block.fa.set_flow_style()
        before = list(spec).index("profiles") if "profiles" in spec else len(spec)
        spec.insert(before, "scaling", block)
    profiles = spec.get("profiles")
    if not isinstance(profiles, CommentedSeq):
        raise SuggestEditError(f"{file}: Model {edit.name} has no profiles list")
    at = next(
        (i for i, p in enumerate(profiles) if isinstance(p, dict) and p.get("name") == edit.profile), None
    )
    if at is None:
        raise SuggestEditError(f"{file}: Model {edit.name} has no profile {edit.profile}")
    if at:
        profiles.insert(0, profiles.pop(at))


def edit_models(text: str, edits: Sequence[ModelEdit], file: str) -> str:
    """`text` with each edit made. Only the edited documents go through the round trip; the others, and
    every line of them, stay as written."""
    pieces = _documents(text)
    for edit in edits:
        if not 0 <= edit.index < len(pieces):
            raise SuggestEditError(f"{file}: no document {edit.index} (it holds {len(pieces)})")
        yaml = _yaml(pieces[edit.index])
        doc = yaml.load(pieces[edit.index])
        _edit(doc, edit, file)
        out = io.StringIO()
        yaml.dump(doc, out)
        pieces[edit.index] = out.getvalue()
    return "".join(pieces)


def unified(file: str, before: str, after: str) -> str:
    """The change as `git diff` shows it."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{file}", f"b/{file}"
    )
    return "".join(lines)
