"""``modelless pipelines register|list|show|delete|plan|query`` (docs/PIPELINES.md)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modelless.cli.app import app, session_of
from modelless.cli.core import UsageProblem, open_client, print_json, print_table, wants_json
from modelless.cli.files import read_json_file
from modelless.cli.models import AppOption, JsonFlag, inputs_of

pipelines_app = typer.Typer(
    help="Pipelines of models under one end-to-end latency SLO.", no_args_is_help=False
)
app.add_typer(pipelines_app, name="pipelines")

NameArgument = Annotated[str, typer.Argument(help="the pipeline's name")]


def _cmd_pipelines(args: Any) -> None:
    with open_client(args) as client:
        if args.action == "register":
            spec = read_json_file(args.spec, "pipelines register")
            if not isinstance(spec, dict):
                raise UsageProblem(f"{args.spec}: must hold a JSON object (the pipeline's spec)")
            reply = client.register_pipeline(spec, args.app)
            if wants_json(args):
                print_json(reply)
            else:
                print(f"pipeline {reply['pipeline']['name']} registered: {' -> '.join(reply['order'])}")
        elif args.action == "list":
            pipelines = client.pipelines(args.app)
            if wants_json(args):
                print_json({"pipelines": pipelines})
                return
            rows = [
                {
                    "pipeline": p["pipeline"]["name"],
                    "stages": " -> ".join(p["order"]),
                    "slo ms": p["pipeline"]["latencySlo"],
                    "accuracy": p["pipeline"]["accuracy"],
                }
                for p in pipelines
            ]
            print_table(rows, ["pipeline", "stages", "slo ms", "accuracy"], empty="no pipelines")
        elif args.action == "show":
            print_json(client.pipeline(args.name, args.app))
        elif args.action == "delete":
            client.delete_pipeline(args.name, args.app)
            if wants_json(args):
                print_json({"deleted": args.name})
            else:
                print(f"pipeline {args.name} deleted")
        elif args.action == "plan":
            plan = client.pipeline_plan(args.name, args.app, args.qps, args.lambda_allowed)
            if wants_json(args):
                print_json(plan)
                return
            print("\n".join(plan["explanation"]))
            if not plan["feasible"]:
                print("NOT FEASIBLE: some load cannot be served within the SLO (see above)")
        elif args.action == "query":
            reply = client.query_pipeline(args.name, inputs_of(args.inputs), args.app)
            if wants_json(args):
                print_json(reply)
                return
            met = "met" if reply["metSlo"] else "MISSED"
            print(f"predictions: {reply['predictions']} (answered by {reply['answeredBy']})")
            print(f"end to end:  {reply['totalMs']} ms, SLO {reply['sloMs']} ms {met}")
            rows = [
                {
                    "stage": st["stage"],
                    "model": st["model"],
                    "ran": "yes" if st["ran"] else f"no: {st['skippedBecause']}",
                    "variant": st["variant"] or "-",
                    "tier": st["tier"] or "-",
                    "budget ms": st["budgetMs"] if st["budgetMs"] is not None else "-",
                    "total ms": st["timingsMs"]["total_ms"] if st["timingsMs"] else "-",
                }
                for st in reply["stages"]
            ]
            print_table(rows, ["stage", "model", "ran", "variant", "tier", "budget ms", "total ms"])


def _run(context: typer.Context, action: str, **values: Any) -> None:
    session_of(context).run("pipelines", _cmd_pipelines, action=action, **values)


@pipelines_app.command("register")
def register(
    context: typer.Context,
    spec: Annotated[str, typer.Argument(help="a .json file: name, stages, edges, latencySlo, accuracy")],
    app_id: AppOption,
) -> None:
    """Register a pipeline from its JSON spec."""
    _run(context, "register", spec=spec, app=app_id)


@pipelines_app.command("list")
def list_(context: typer.Context, app_id: AppOption) -> None:
    """The app's pipelines."""
    _run(context, "list", app=app_id)


@pipelines_app.command("show")
def show(context: typer.Context, name: NameArgument, app_id: AppOption) -> None:
    """A pipeline, its order and measured branch probabilities (JSON)."""
    _run(context, "show", name=name, app=app_id)


@pipelines_app.command("delete")
def delete(context: typer.Context, name: NameArgument, app_id: AppOption) -> None:
    """Delete a pipeline."""
    _run(context, "delete", name=name, app=app_id)


@pipelines_app.command("plan")
def plan(
    context: typer.Context,
    name: NameArgument,
    app_id: AppOption,
    qps: Annotated[float, typer.Option(help="the arrival rate to plan for")],
    lambda_allowed: Annotated[
        bool, typer.Option("--lambda-allowed", help="let the plan use the Lambda tier")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="print the whole plan (as --output json)")] = False,
) -> None:
    """The planner's per-stage variant, batch and instances for an arrival rate, explained."""
    _run(context, "plan", name=name, app=app_id, qps=qps, lambda_allowed=lambda_allowed, json=json_)


@pipelines_app.command("query")
def query(
    context: typer.Context,
    name: NameArgument,
    app_id: AppOption,
    inputs: Annotated[str, typer.Option(help=".npy, .npz or .json file (the entry stage's inputs)")],
    json_: JsonFlag = False,
) -> None:
    """One online query through a pipeline."""
    _run(context, "query", name=name, app=app_id, inputs=inputs, json=json_)
