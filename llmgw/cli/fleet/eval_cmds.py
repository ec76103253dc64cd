"""`llmgw eval SUITE --model M [--replica R]` and `llmgw model check MODEL [--replica R]`: through a running
controller, which runs them straight against one ready replica (docs/canaries.md says why). Exit 1 when the
suite or a probe failed, so a script can gate on it.
"""

from __future__ import annotations

import urllib.parse
from typing import Annotated, Any

import typer

from llmgw.cli import output
from llmgw.cli.data.mirror_cmds import model_app
from llmgw.cli.reach import ControllerOpt, JsonOpt, TokenOpt, controller_client

ReplicaOpt = Annotated[
    str | None, typer.Option("--replica", help="One replica id (default: the model's oldest ready one)")
]
_SLOW_S = 900.0  # a CPU engine answering every case in turn


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_suite)
    model_app.command("check")(model_check)


def _post(controller: str | None, token_file: Any, path: str, body: dict[str, Any]) -> Any:
    client = controller_client(controller, token_file)
    client.timeout_s = _SLOW_S
    return client.post(path, body)[1]


def eval_suite(
    suite: Annotated[str, typer.Argument(help="An EvalSuite of the applied revision")],
    model: Annotated[str, typer.Option("--model", help="The model to evaluate")],
    replica: ReplicaOpt = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run an eval suite on one replica of a model and print each case's result."""
    body: dict[str, Any] = {"suite": suite, "model": model}
    if replica is not None:
        body["replica"] = replica
    data = _post(controller, token_file, "/api/v1/evals/run", body)
    if as_json:
        output.print_json(data)
    else:
        typer.echo(f"suite {data['suite']} on {data['model']} (replica {data['replica']})")
        for case in data["cases"]:
            mark = "pass" if case["passed"] else "FAIL"
            typer.echo(f"  {mark}  {case['case']}: {case['detail']}")
        good = sum(1 for c in data["cases"] if c["passed"])
        verdict = "passed" if data["passed"] else "failed"
        typer.echo(
            f"{verdict}: {good}/{len(data['cases'])} cases, score {data['score']:g} (threshold {data['threshold']:g})"
        )
    if not data["passed"]:
        raise typer.Exit(1)


def model_check(
    model: Annotated[str, typer.Argument(help="A model of the applied revision")],
    replica: ReplicaOpt = None,
    controller: ControllerOpt = None,
    token_file: TokenOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Probe one replica for each declared capability (tools, response_format, streaming usage); the verdict
    is recorded for the model and its engine version, and routers follow it."""
    body: dict[str, Any] = {} if replica is None else {"replica": replica}
    data = _post(controller, token_file, f"/api/v1/models/{urllib.parse.quote(model, safe='')}/check", body)
    if as_json:
        output.print_json(data)
    else:
        typer.echo(
            f"{data['model']} on {data['engine']} {data['engine_version']} (replica {data['replica']})"
        )
        for probe in data["probes"]:
            typer.echo(f"  {probe['probe']}: {probe['detail']}")
    if not data["passed"]:
        raise typer.Exit(1)
