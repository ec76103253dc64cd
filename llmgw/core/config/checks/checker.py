"""What the whole-repo checks share: the documents, and the list each problem is added to (`Checker.add`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.core.config.errors import PathPart, SemanticError
from llmgw.core.config.models import (
    Document as DocumentUnion,
)

Document = DocumentUnion


@dataclass
class Checker:
    documents: Sequence[Document]
    tolerate: Mapping[str, frozenset[str]]
    errors: list[SemanticError] = field(default_factory=list)
    model_names: dict[str, int] = field(default_factory=dict)  # name or alias -> document index
    canonical: dict[str, str] = field(default_factory=dict)  # name or alias -> model name

    def add(
        self,
        index: int,
        path: tuple[PathPart, ...],
        message: str,
        hint: str | None = None,
        *,
        warning: bool = False,
    ) -> None:
        doc = self.documents[index]
        self.errors.append(
            SemanticError(
                index,
                path,
                message,
                hint,
                "warning" if warning else "error",
                subject=f"{doc.kind} {doc.metadata.name}",
            )
        )

    def tolerated(self, kind: str, name: str) -> bool:
        return name in self.tolerate.get(kind, frozenset())

    def names_of(self, kind: type[Document]) -> dict[str, int]:
        out: dict[str, int] = {}
        for index, doc in enumerate(self.documents):
            if isinstance(doc, kind) and doc.metadata.name not in out:
                out[doc.metadata.name] = index
        return out
