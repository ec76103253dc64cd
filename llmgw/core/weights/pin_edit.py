"""Edit one scalar of a YAML file in place, where the parser said it is, leaving every other byte as written
(comments, order, quoting): how `llmgw model update --write` moves a pin. Pure: text in, text out."""

from __future__ import annotations

from llmgw.core.errors import LlmgwError

__all__ = ["PinEditError", "replace_scalar"]


class PinEditError(LlmgwError):
    """The value is not where and what the parser said; the file was changed since it was read."""


def replace_scalar(text: str, line: int, col: int, old: str, new: str) -> str:
    """`text` with the scalar `old` that starts at 1-based `line`:`col` (plain, or in ' or " quotes) made `new`,
    quoted as it was."""
    lines = text.splitlines(keepends=True)
    if not 1 <= line <= len(lines):
        raise PinEditError(f"line {line}: the file has {len(lines)} lines")
    current = lines[line - 1]
    at = col - 1
    quote = current[at : at + 1] if current[at : at + 1] in ("'", '"') else ""
    written = f"{quote}{old}{quote}"
    if current[at : at + len(written)] != written:
        raise PinEditError(f"line {line} column {col}: expected {written!r}, found {current[at:].strip()!r}")
    lines[line - 1] = current[:at] + f"{quote}{new}{quote}" + current[at + len(written) :]
    return "".join(lines)
