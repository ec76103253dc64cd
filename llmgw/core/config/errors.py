"""Error records of the validation pipeline: values, not exceptions, so every problem is reported at once."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

Severity = Literal["error", "warning"]
PathPart = str | int
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def format_path(path: tuple[PathPart, ...]) -> str:
    """`("spec", "profiles", 0, "gpus")` -> `spec.profiles[0].gpus`; odd keys are quoted (`labels["a.b/c"]`)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            escaped = part.replace("\\", "\\\\").replace('"', '\\"')
            out += f'["{escaped}"]'
    return out


@dataclass(frozen=True)
class ConfigError:
    """One problem in the cluster repo: where (file, 1-based line and column, path in the document), what is
    wrong (`message`) and what would be right (`hint`, when there is something to say)."""

    file: str
    line: int
    col: int
    path: str
    message: str
    hint: str | None = None
    severity: Severity = "error"

    def format_text(self) -> str:
        where = f"{self.file}:{self.line}:{self.col}"
        what = f"{self.path}: {self.message}" if self.path else self.message
        hint = f" ({self.hint})" if self.hint else ""
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}: {tag}{what}{hint}"

    def __str__(self) -> str:
        return self.format_text()

    def format_github(self) -> str:
        level = "warning" if self.severity == "warning" else "error"
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.hint:
            text += f" ({self.hint})"
        # GitHub workflow commands end at a newline and treat % specially.
        text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
        return f"::{level} file={self.file},line={self.line},col={self.col}::{text}"

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "col": self.col,
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity,
        }


@dataclass(frozen=True)
class SemanticError:
    """A whole-repo problem found by the catalog: `document` indexes the documents given to `Catalog.build`,
    `path` is inside that document. The loader turns it into a ConfigError with a position."""

    document: int
    path: tuple[PathPart, ...]
    message: str
    hint: str | None = None
    severity: Severity = "error"
    # Shown when no loader maps the error (e.g. "Model gemma"); set by the checks.
    subject: str = ""

    def describe(self) -> str:
        where = f"{self.subject} " if self.subject else f"document {self.document} "
        hint = f" ({self.hint})" if self.hint else ""
        return f"{where}{format_path(self.path)}: {self.message}{hint}"


class IssueAdder(Protocol):
    """How a whole-repo check reports an issue at a document's path (checks/checker.Checker.add)."""

    def __call__(
        self,
        index: int,
        path: tuple[PathPart, ...],
        message: str,
        hint: str | None = None,
        *,
        warning: bool = False,
    ) -> None: ...
