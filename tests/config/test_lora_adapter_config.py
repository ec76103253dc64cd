"""The Adapter kind in the repo: loaded into the catalog in its replicas' start order, part of a LoRA
profile's fingerprint, and its mistakes refused at file:line:col with what would be right."""

from __future__ import annotations

from pathlib import Path

from llmgw.adapters.repo_files import load_repo

MODELS = """\
apiVersion: llmgw/v1
kind: Model
metadata: {name: gemma}
spec:
  context_length: 2048
  source: {path: /models/gemma.gguf}
  profiles: [{name: cpu, engine: llamacpp}]
---
apiVersion: llmgw/v1
kind: Model
metadata: {name: simmy}
spec:
  context_length: 2048
  profiles: [{name: s, engine: sim}]
---
apiVersion: llmgw/v1
kind: Organization
metadata: {name: acme}
---
apiVersion: llmgw/v1
kind: Project
metadata: {name: bot}
spec: {organization: acme}
"""


def adapter(name: str, spec: str) -> str:
    return f"---\napiVersion: llmgw/v1\nkind: Adapter\nmetadata: {{name: {name}}}\nspec:\n{spec}\n"


def load(tmp_path: Path, *adapters: str):  # type: ignore[no-untyped-def]
    (tmp_path / "repo.yaml").write_text(MODELS + "".join(adapters))
    return load_repo(tmp_path)


def errors(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(e).split("/")[-1] for e in result.errors]


def test_adapters_load_in_name_order_and_change_their_bases_fingerprint(tmp_path: Path) -> None:
    plain = load(tmp_path)
    assert plain.ok, errors(plain)
    result = load(
        tmp_path,
        adapter("pirate", "  base: gemma\n  source: {path: /adapters/pirate.gguf}\n  projects: [bot]"),
        adapter("legal", "  base: gemma\n  source: {url: http://mirror/legal.gguf}\n  rank: 16"),
    )
    assert result.ok and result.repo is not None, errors(result)
    catalog = result.repo.catalog
    assert [n for n, _ in catalog.adapters_of("gemma")] == ["legal", "pirate"]
    assert catalog.adapters["pirate"].projects == ["bot"]
    assert plain.repo is not None
    before = plain.repo.catalog.models["gemma"].profiles[0].fingerprint
    assert catalog.models["gemma"].profiles[0].fingerprint != before, "another adapter set is another replica"


def test_adapter_mistakes_are_refused_at_their_place(tmp_path: Path) -> None:
    result = load(
        tmp_path,
        adapter("a1", "  base: gema\n  source: {path: /a.gguf}"),
        adapter("a2", "  base: simmy\n  source: {path: /a.gguf}"),
        adapter("gemma", "  base: gemma\n  source: {path: /a.gguf}"),
        adapter("a4", "  base: gemma\n  source: {path: /a.gguf}\n  projects: [bott]"),
    )
    assert not result.ok
    text = "\n".join(errors(result))
    assert "base model `gema` is not defined" in text and "gemma" in text
    assert "base model `simmy` runs on sim, which carries no LoRA adapter" in text
    assert "has the name of a model or alias" in text
    assert "Project `bott` is not defined" in text
    assert all(line.startswith("repo.yaml:") for line in errors(result)), text
