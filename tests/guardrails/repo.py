"""A cluster repo with guardrails at every level of the tenant tree, and the snapshot a controller would
publish from it (the catalog's resolution, not one written by hand)."""

from __future__ import annotations

from typing import Any

from llmgw.controller.wire.publisher import published_models
from llmgw.core.desired.catalog import Catalog
from llmgw.core.desired.repo import validate_files
from llmgw.core.snapshot import RouterSnapshot

TENANTS = """
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Team
metadata: {name: research}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: p1}
spec: {team: research}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: p2}
spec: {organization: acme}
---
apiVersion: llmgw/v1
kind: Organization
metadata: {name: other}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: p3}
spec: {organization: other}
"""

MODELS = """
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-chat}
spec: {context_length: 4096, capabilities: [chat, completions], profiles: [{name: sim, engine: sim}]}
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: sim-out}
spec: {context_length: 4096, capabilities: [chat, completions], profiles: [{name: sim, engine: sim}]}
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: guard}
spec: {context_length: 8192, capabilities: [completions], role: guard, profiles: [{name: sim, engine: sim}]}
"""

GUARDRAILS = """
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: org-pii}
spec:
  mode: redact
  pii: [email, card]
  attach: {organizations: [acme]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: team-words}
spec:
  keywords: [forbidden]
  attach: {teams: [research]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: p1-judge}
spec:
  judge: {model: guard, timeout: 3s}
  on_judge_error: closed
  attach: {projects: [p1]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: p2-judge}
spec:
  judge: {model: guard, timeout: 3s, categories: [S9]}
  on_judge_error: open
  attach: {projects: [p2]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: p3-warn}
spec:
  mode: warn
  keywords: [heads-up]
  attach: {projects: [p3]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: out-cut}
spec:
  stages: [output]
  keywords: [omega]
  attach: {models: [sim-out]}
---
apiVersion: llmgw/v1
kind: Guardrail
metadata: {name: out-judge}
spec:
  stages: [output]
  judge: {model: guard, timeout: 3s}
  attach: {models: [sim-out]}
"""

CLUSTER_OFF = """
apiVersion: llmgw/v1
kind: Cluster
metadata: {name: c}
spec: {guardrails_enabled: false}
"""


def files(**extra: str) -> dict[str, bytes]:
    out = {"tenants.yaml": TENANTS, "models.yaml": MODELS, "guardrails.yaml": GUARDRAILS, **extra}
    return {name: text.encode() for name, text in out.items()}


def catalog(**extra: str) -> Catalog:
    result = validate_files(files(**extra))
    assert result.repo is not None, [str(e) for e in result.errors]
    return result.repo.catalog


def snapshot(cat: Catalog, endpoints: list[dict[str, Any]]) -> RouterSnapshot:
    return RouterSnapshot.model_validate(
        {
            "revision": cat.revision or "test",
            "models": {n: m.model_dump() for n, m in published_models(cat).items()},
            "tenants": cat.tenants().model_dump(),
            "guard": cat.published_guard().model_dump(),
            "endpoints": endpoints,
        }
    )
