"""Which of a valid repo's secret references need a line in the operator's binding map, with the line: what
`llmgw validate` and `llmgw plan` print (llmgw.core.config.secret_bindings has the rule). Pure.

Both commands run where the map usually is not (CI, a laptop): without one (`bindings=None`) each reference
that is sent somewhere is listed as a warning with the line that would bind it to what the repo says; given
the map (`--bindings FILE`), only the references it does not allow are listed, as errors.
"""

from __future__ import annotations

from llmgw.core.config.errors import ConfigError, Severity, format_path
from llmgw.core.config.models import Cluster
from llmgw.core.config.secret_bindings import (
    BINDINGS_FILE,
    SecretBindings,
    binding_problem,
    documents_reserved_names,
    secret_uses,
)
from llmgw.core.desired.repo import Repo

__all__ = ["binding_report"]


def binding_report(repo: Repo, bindings: SecretBindings | None) -> tuple[ConfigError, ...]:
    """One problem per reference `bindings` does not allow (errors), or per bound-kind reference when no map
    is given (warnings: the map is the operator's, outside the repo)."""
    documents = [d.document for d in repo.documents]
    cluster = next((d for d in documents if isinstance(d, Cluster)), None)
    origin = cluster.spec.mirror.origin if cluster is not None else "none"
    reserved = documents_reserved_names(documents)
    known = bindings if bindings is not None else SecretBindings({})
    out: list[ConfigError] = []
    severity: Severity = "warning" if bindings is None else "error"
    for loaded in repo.documents:
        for path, use in secret_uses(loaded.document, origin):
            problem = binding_problem(known, use, reserved)
            if problem is None or problem.line is None:  # bound, or a reserved name: validate refuses that
                continue
            pos = loaded.positions.value(path)
            if bindings is None:
                message = (
                    f"{use.purpose} is sent to {use.destination}: the operator's {BINDINGS_FILE} must bind it"
                )
                hint = f"in the secrets directory's {BINDINGS_FILE} (check it with --bindings FILE): {problem.line}"
            else:
                message = problem.message
                hint = problem.advice()
            out.append(
                ConfigError(loaded.file, pos.line, pos.col, format_path(path), message, hint, severity)
            )
    return tuple(out)
