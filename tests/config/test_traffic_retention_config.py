"""`Project.spec.retention`: a project opts in to keep content with a TTL; `llmgw validate` names what is
wrong at its file:line:col, and the catalog tells how long a project may keep content."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from llmgw.adapters.repo_files import load_repo
from llmgw.cli.main import app
from llmgw.core.traffic.recorded import content_ttl

TENANTS = """\
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
spec: {}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: keeps}
spec:
  organization: acme
  retention: {content: true, ttl: %(ttl)s}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: declines}
spec:
  organization: acme
  retention: {content: false}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: silent}
spec: {organization: acme}
"""


def test_only_an_opted_in_project_keeps_content_for_its_ttl(tmp_path: Path) -> None:
    (tmp_path / "tenants.yaml").write_text(TENANTS % {"ttl": "2h"})
    catalog = load_repo(tmp_path).catalog
    assert catalog is not None
    ttls = {name: content_ttl(t.retention) for name, t in catalog.projects.items()}
    assert ttls == {"keeps": 7200.0, "declines": None, "silent": None}


def test_a_zero_or_unreadable_ttl_is_an_error_at_its_place(tmp_path: Path) -> None:
    for ttl, expected in (
        ("0s", "tenants.yaml:11:35: spec.retention.ttl: ttl must be longer than zero (got '0s'; e.g. 7d)"),
        (
            "soon",
            'tenants.yaml:11:35: spec.retention.ttl: "soon" is not a valid value here (write a whole number',
        ),
    ):
        (tmp_path / "tenants.yaml").write_text(TENANTS % {"ttl": ttl})
        result = CliRunner().invoke(app, ["validate", str(tmp_path)])
        assert result.exit_code == 1
        assert expected in result.output.replace(str(tmp_path) + "/", ""), result.output
