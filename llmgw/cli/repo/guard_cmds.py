"""`llmgw guard test GUARDRAIL TEXT`: how one of the repo's Guardrails judges a text, decided by the same pure
functions the router runs (llmgw.core.evals.guardrails).

Offline for the deterministic checks: the repo is read from disk, nothing is contacted. A guardrail with a
judge asks it only when `--judge-url` names an OpenAI-compatible base URL that serves the judge model's raw
completions: a router (`http://router:8080/v1`, with an API key of a project that may use the judge model, in
the environment variable `--key-env` names) or the judge's engine itself. Without it the judge is reported as
not asked, never as `safe`.

Exit status: 0 the text would be served (pass, warn, redact, or a judge that fails open), 1 it would be
refused, 2 the repo or the guardrail cannot be used.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import typer

from llmgw.adapters.repo_files import load_repo
from llmgw.core.evals import guardrails as gr
from llmgw.core.words import parse_duration

app = typer.Typer(help="Guardrails: see how a text is judged.", no_args_is_help=True)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="guard")


@app.command("test")
def test(
    guardrail: Annotated[str, typer.Argument(help="Name of a Guardrail in the repo")],
    text: Annotated[
        str, typer.Argument(help="The text to judge (a prompt, or an answer with --stage output)")
    ],
    repo: Annotated[Path, typer.Option(help="Cluster repo directory")] = Path("."),
    stage: Annotated[str, typer.Option(help="input (a prompt) or output (an answer)")] = "input",
    judge_url: Annotated[
        str | None,
        typer.Option(
            help="OpenAI-compatible base URL serving the judge model (a router's /v1, or the engine's)"
        ),
    ] = None,
    key_env: Annotated[
        str, typer.Option(help="Environment variable holding the API key sent to --judge-url")
    ] = "LLMGW_API_KEY",
    output: Annotated[str, typer.Option("--format", "-f", help="text or json")] = "text",
) -> None:
    """Show which rules of GUARDRAIL the text trips, what the guardrail would do, and the redacted text."""
    if stage not in ("input", "output"):
        raise typer.BadParameter("input or output", param_hint="--stage")
    result = load_repo(repo)
    if result.repo is None:
        typer.echo("\n".join(str(e) for e in result.errors), err=True)
        raise typer.Exit(2)
    specs = result.repo.catalog.guardrails
    if guardrail not in specs:
        known = ", ".join(sorted(specs)) or "none"
        typer.echo(f"no Guardrail `{guardrail}` in {repo} (the repo has: {known})", err=True)
        raise typer.Exit(2)
    g = gr.compile_guardrail(guardrail, specs[guardrail])
    the_stage: gr.Stage = "input" if stage == "input" else "output"
    report = asyncio.run(_judge(g, text, the_stage, judge_url, os.environ.get(key_env)))
    typer.echo(json.dumps(report, indent=2) if output == "json" else _text(report))
    raise typer.Exit(1 if report["action"] == "block" else 0)


async def _judge(
    g: gr.CompiledGuardrail, text: str, stage: gr.Stage, url: str | None, key: str | None
) -> dict[str, Any]:
    spec = g.spec
    findings = gr.scan(g, text, stage) if g.checks(stage) else []
    unjudged: list[str] = []
    judge: dict[str, Any] | None = None
    if spec.judge is not None and g.checks(stage):
        turns: list[gr.Turn] = [("User" if stage == "input" else "Agent", text)]
        prompt = gr.llama_guard_prompt(turns)
        if url is None:
            judge = {"model": spec.judge.model, "asked": False, "why": "offline: pass --judge-url to ask it"}
            unjudged.append(g.name)
        else:
            answer_text = await _ask(url, key, spec.judge.model, prompt, parse_duration(spec.judge.timeout))
            answer = gr.parse_judge_answer(answer_text) if answer_text is not None else None
            judge = {"model": spec.judge.model, "asked": True, "answer": answer_text}
            if answer is None:
                findings += (
                    [gr.Finding(g.name, "judge_unavailable")] if spec.on_judge_error == "closed" else []
                )
                unjudged += [g.name] if spec.on_judge_error == "open" else []
            else:
                finding = gr.judge_finding(g, answer)
                findings += [finding] if finding is not None else []
    verdict = gr.decide([g], findings, stage, unjudged)
    report: dict[str, Any] = {
        "guardrail": g.name,
        "mode": spec.mode,
        "stages": list(spec.stages),
        "checked": g.checks(stage),
        "on_judge_error": spec.on_judge_error,
        **verdict.record(),
        "judge": judge,
    }
    if verdict.action == "block":
        report["refusal"] = gr.refusal_message(verdict)
    if verdict.action == "redact":
        report["redacted"] = gr.redact(g, text)
    return report


async def _ask(url: str, key: str | None, model: str, prompt: str, limit_s: float) -> str | None:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    payload = {"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit_s)) as s,
            s.post(url.rstrip("/") + "/completions", json=payload, headers=headers) as resp,
        ):
            data = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
        return None
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    answer = choices[0].get("text")
    return answer if isinstance(answer, str) else None


def _text(report: dict[str, Any]) -> str:
    lines = [f"guardrail {report['guardrail']}: mode {report['mode']}, stages {', '.join(report['stages'])}"]
    if not report["checked"]:
        lines.append(f"  does not check the {report['stage']}")
    for rule in report.get("rules", []):
        lines.append(f"  tripped: {rule}")
    judge = report["judge"]
    if judge is not None:
        said = repr(judge["answer"]) if judge["asked"] else judge["why"]
        lines.append(f"  judge {judge['model']}: {said} (fails {report['on_judge_error']})")
    lines.append(f"verdict: {report['action']}")
    if "refusal" in report:
        lines.append(f"refusal: {report['refusal']}")
    if "redacted" in report:
        lines.append(f"redacted: {report['redacted']}")
    return "\n".join(lines)
