"""A disaggregated model's pairing in the repo (issue 46): published with its pools' names, aliases resolved,
and every mistake refused where it is written, saying what would be right."""

from __future__ import annotations

from pathlib import Path

from llmgw.adapters.repo_files import load_repo
from llmgw.controller.wire.publisher import published_models


def model(name: str, spec: str, role: str = "both", engine: str = "sim") -> str:
    return (
        f"---\napiVersion: llmgw/v1\nkind: Model\nmetadata: {{name: {name}}}\nspec:\n  context_length: 2048\n"
        f"{spec}  profiles: [{{name: p, engine: {engine}, role: {role}}}]\n"
    )


def load(tmp_path: Path, *docs: str):  # type: ignore[no-untyped-def]
    (tmp_path / "repo.yaml").write_text("".join(docs))
    return load_repo(tmp_path)


def errors(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [str(e).rsplit("repo.yaml", 1)[-1] for e in result.errors]


PAIRED = "  disaggregation: {prefill: pre, decode: dec, on_failure: retry}\n"


def test_a_pairing_is_published_with_its_pools_names(tmp_path: Path) -> None:
    result = load(
        tmp_path,
        model("m", PAIRED),
        model("m-prefill", "  aliases: [pre]\n", "prefill"),
        model("m-decode", "  aliases: [dec]\n", "decode"),
    )
    assert result.ok and result.repo is not None, errors(result)
    published = published_models(result.repo.catalog)
    pd = published["m"].disaggregation
    assert pd is not None and (pd.prefill, pd.decode, pd.on_failure) == ("m-prefill", "m-decode", "retry")
    assert published["m-prefill"].disaggregation is None


def test_mistakes_are_refused_where_they_are_written(tmp_path: Path) -> None:
    result = load(
        tmp_path,
        model("m", "  disaggregation: {prefill: m-prefil, decode: m}\n"),
        model("m-prefill", "", "decode"),
        model("lonely", "", "prefill"),
        model("big", "  disaggregation: {prefill: p2, decode: d2}\n"),
        model("p2", "", "prefill", engine="llamacpp"),
        model("d2", "", "both"),
    )
    said = "\n".join(errors(result))
    assert "prefill pool `m-prefil` is not a model or alias" in said and "did you mean `m-prefill`?" in said
    assert "decode pool `m` is this model itself" in said
    assert (
        "profile `p` has role decode: no model's `disaggregation` names this model as its decode pool" in said
    )
    assert (
        "profile `p` has role prefill: no model's `disaggregation` names this model as its prefill pool"
        in said
    )
    assert (
        "profile `p` has role both in a model serving as a decode pool" in said
        and "set `role: decode`" in said
    )
    assert "engine llamacpp does not speak vLLM's prefill/decode protocol" in said
