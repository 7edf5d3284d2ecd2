"""Commands over an app's models: register, status, registrations, variants, import-profiles,
query, feedback and selection."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, Literal

import httpx
import typer

from modelless.cli.app import app, session_of
from modelless.cli.core import (
    CommandError,
    ExitCode,
    UsageProblem,
    exit_code_for,
    open_client,
    print_json,
    print_table,
    wants_json,
)
from modelless.cli.files import file_or_uri, load_inputs, read_json_file, recipe
from modelless.cli.progress import follow_registration
from modelless.cli.text import (
    format_table,
    progress_bar,
    registration_lines,
    registration_outcome,
    share,
    variant_rows,
)
from modelless.client import Client, ModellessClientError

AppOption = Annotated[str, typer.Option("--app", help="the app")]
JsonFlag = Annotated[bool, typer.Option("--json", help="print the whole reply (as --output json)")]


# --- register ----------------------------------------------------------------------------------


def _cmd_register(args: Any) -> None:
    """Register, then follow the registration to its end. A refusal or an unreachable server
    ends with one line and its exit code (ExitCode), never a traceback."""
    try:
        _register(args)
    except ModellessClientError as error:
        details = "".join(f"; {key}: {value}" for key, value in error.details.items())
        raise CommandError(
            exit_code_for(error), f"registration refused: {error}{details}", error.code, error.details
        ) from None
    except httpx.HTTPError as error:
        raise CommandError(
            ExitCode.UNAVAILABLE,
            f"registration not sent: could not reach the server ({type(error).__name__}: {error})",
            "unavailable",
        ) from None
    except OSError as error:  # a model or validation file that cannot be read
        raise UsageProblem(f"registration not sent: {error}") from None


def _register(args: Any) -> None:
    with open_client(args) as client:
        reply = client.register_model(
            args.name,
            file_or_uri(args.model, "--model"),
            file_or_uri(args.valset, "--valset"),
            args.app,
            args.metric,
            preprocessing=recipe(args.preprocessing),
            model_data=file_or_uri(args.model_data, "--model-data") if args.model_data else None,
        )
        if args.no_wait:
            if wants_json(args):
                print_json(reply)
            else:
                print(f"registration {reply['registrationId']} accepted")
            return
        if not wants_json(args):
            print(f"registration {reply['registrationId']} accepted", flush=True)
        final = follow_registration(
            client, reply["registrationId"], args.app, args.stall_timeout, args.max_wait
        )
    outcome = registration_outcome(final, args.name)
    if wants_json(args):
        print_json(final)
    if final["status"] == "failed":
        raise CommandError(
            ExitCode.REFUSED, outcome, "registration_failed", {"registrationId": final.get("registrationId")}
        )
    if not wants_json(args):
        print(outcome, flush=True)


@app.command("register")
def register(
    context: typer.Context,
    app_id: AppOption,
    name: Annotated[str, typer.Option(help="model name")],
    model: Annotated[
        str, typer.Option(help="ONNX file, a zip/tar holding it with its external data, or s3://bucket/key")
    ],
    valset: Annotated[
        str,
        typer.Option(
            help=".npz with 'labels' and the inputs ('inputs', or one array per input name), or s3://bucket/key"
        ),
    ],
    model_data: Annotated[
        str | None, typer.Option(help="the model's external data file (x.onnx.data), or s3://bucket/key")
    ] = None,
    preprocessing: Annotated[
        str | None, typer.Option(help="JSON file: the recipe that turns image bytes into the model's input")
    ] = None,
    metric: Annotated[Literal["top1", "top5"], typer.Option(help="accuracy metric")] = "top1",
    no_wait: Annotated[bool, typer.Option("--no-wait", help="return once accepted")] = False,
    stall_timeout: Annotated[
        float,
        typer.Option(help="give up waiting after this many seconds without progress (exit code 2)"),
    ] = 900.0,
    max_wait: Annotated[
        float | None, typer.Option(help="give up waiting after this many seconds in all (exit code 2)")
    ] = None,
) -> None:
    """Register a model: variants are generated and profiled, with a progress bar on stderr.
    Exit code: 0 ready, 1 failed or refused, 2 gave up waiting (it goes on server-side), 3 server
    unavailable."""
    session_of(context).run(
        "register",
        _cmd_register,
        app=app_id,
        name=name,
        model=model,
        valset=valset,
        model_data=model_data,
        preprocessing=preprocessing,
        metric=metric,
        no_wait=no_wait,
        stall_timeout=stall_timeout,
        max_wait=max_wait,
    )


# --- registrations -----------------------------------------------------------------------------


def _cmd_status(args: Any) -> None:
    with open_client(args) as client:
        status = client.registration(args.registration_id)
    if wants_json(args):
        print_json(status)
    else:
        print(progress_bar(status))


@app.command("status")
def status(
    context: typer.Context,
    registration_id: Annotated[str, typer.Argument(help="the registration's id (register prints it)")],
    app_id: AppOption,
) -> None:
    """A registration's progress."""
    session_of(context).run("status", _cmd_status, registration_id=registration_id, app=app_id)


def _cmd_registrations(args: Any) -> None:
    with open_client(args) as client:
        registrations = client.registrations()
    if wants_json(args):
        print_json({"registrations": registrations})
    else:
        print("\n".join(registration_lines(registrations)) or "no registrations")


@app.command("registrations")
def registrations(context: typer.Context, app_id: AppOption) -> None:
    """Registration progress of the app's models."""
    session_of(context).run("registrations", _cmd_registrations, app=app_id)


# --- variants --------------------------------------------------------------------------------------


def _cmd_variants(args: Any) -> None:
    if args.watch and wants_json(args):
        raise UsageProblem("--watch redraws a table for people; with --output json, poll instead")
    with open_client(args) as client:
        if args.watch:
            _watch(client, args.model, args.interval)
            return
        variants = client.variants(args.model)
    if wants_json(args):
        print_json({"variants": variants})
        return
    rows = variant_rows(variants)
    print_table(rows, list(rows[0]) if rows else ["variant"])


def _watch(client: Client, model: str | None, interval_s: float) -> None:
    """Redraw registrations and the variants table until every registration has finished."""
    live = sys.stdout.isatty()
    shown = ""
    while True:
        registrations = client.registrations()
        rows = variant_rows(client.variants(model))
        screen = "\n".join(
            [
                *registration_lines(registrations),
                "",
                format_table(rows, list(rows[0]) if rows else ["variant"]),
            ]
        )
        if screen != shown:
            # On a terminal, redraw in place; into a file or pipe, append only what changed.
            print(("\033[H\033[J" if live else "") + screen, flush=True)
            shown = screen
        if all(r["status"] in {"ready", "failed"} for r in registrations):
            return
        time.sleep(interval_s)


@app.command("variants")
def variants(
    context: typer.Context,
    app_id: AppOption,
    model: Annotated[str | None, typer.Option(help="one model's variants only")] = None,
    watch: Annotated[bool, typer.Option("--watch", help="live table until registrations finish")] = False,
    interval: Annotated[float, typer.Option(help="seconds between refreshes")] = 1.0,
) -> None:
    """Table of the app's variants and their profiles."""
    session_of(context).run(
        "variants", _cmd_variants, app=app_id, model=model, watch=watch, interval=interval
    )


def _cmd_import_profiles(args: Any) -> None:
    profiles = read_json_file(args.file, "import-profiles")
    if not isinstance(profiles, list):
        raise UsageProblem(f"{args.file} must hold a JSON list of profiles")
    with open_client(args) as client:
        imported = client.import_profiles(args.model, profiles, args.app)
    if wants_json(args):
        print_json({"imported": imported})
    else:
        print(f"imported {len(imported)} profile(s):\n" + "\n".join(imported))


@app.command("import-profiles")
def import_profiles(
    context: typer.Context,
    file: Annotated[str, typer.Argument(help="JSON list of profiles (see docs/VARIANTS.md)")],
    app_id: AppOption,
    model: Annotated[str, typer.Option(help="the model the profiles are of")],
) -> None:
    """Import profiles measured on hardware this deployment lacks (GPU, Inferentia)."""
    session_of(context).run("import-profiles", _cmd_import_profiles, app=app_id, model=model, file=file)


# --- queries -------------------------------------------------------------------------------------


def inputs_of(value: str) -> Any:
    """``load_inputs`` of an --inputs file, a usage error when it cannot be read."""
    try:
        return load_inputs(Path(value))
    except (OSError, ValueError) as error:
        raise UsageProblem(f"--inputs {value}: {error}") from None


def _cmd_query(args: Any) -> None:
    inputs = inputs_of(args.inputs)
    with open_client(args) as client:
        reply = client.online_query(
            inputs,
            args.app,
            latency=args.latency,
            accuracy=args.accuracy,
            model_name=args.model,
            encoding=args.encoding,
        )
    if wants_json(args):
        print_json(reply)
        return
    print(f"predictions: {reply['predictions']}")
    print(
        f"variant:     {reply['variant']} ({reply['variantState']}) "
        f"on {reply['tier']} {reply['worker'] or ''}"
    )
    print(f"why:         {reply['reason']}")
    ensemble = reply.get("ensemble")
    if ensemble:
        missing = (
            f"; missing (late or failed): {', '.join(ensemble['missing'])}" if ensemble["missing"] else ""
        )
        print(f"ensemble:    {', '.join(ensemble['members'])}{missing}; confidence {ensemble['confidence']}")
    print(
        f"query id:    {reply['queryId']} (policy {reply.get('policy', 'infaas')}; for `modelless feedback`)"
    )
    print("timings ms:  " + ", ".join(f"{k.removesuffix('_ms')}={v}" for k, v in reply["timingsMs"].items()))
    client_timings = reply.get("clientTimingsMs", {})
    print("client ms:   " + ", ".join(f"{k}={v}" for k, v in client_timings.items()))


@app.command("query")
def query(
    context: typer.Context,
    app_id: AppOption,
    inputs: Annotated[
        str,
        typer.Option(
            help=".npy array, .npz ('inputs', or one array per input name), .json, or a .png/.jpg image"
        ),
    ],
    encoding: Annotated[
        Literal["npy", "json"],
        typer.Option(help="send arrays binary (.npy/.npz, the default) or as JSON"),
    ] = "npy",
    latency: Annotated[float | None, typer.Option(help="latency budget, ms")] = None,
    accuracy: Annotated[float | None, typer.Option(help="minimum accuracy, 0..1")] = None,
    model: Annotated[str | None, typer.Option(help="name the model instead of giving targets")] = None,
    json_: JsonFlag = False,
) -> None:
    """Online query: the system picks the variant."""
    session_of(context).run(
        "query",
        _cmd_query,
        app=app_id,
        inputs=inputs,
        encoding=encoding,
        latency=latency,
        accuracy=accuracy,
        model=model,
        json=json_,
    )


# --- feedback and selection ----------------------------------------------------------------------


def _cmd_feedback(args: Any) -> None:
    with open_client(args) as client:
        if args.stats:
            stats = client.feedback_stats(args.app)
            if wants_json(args):
                print_json(stats)
                return
            rows = [
                {
                    "model": m["model"],
                    "feedbacks": m["feedbacks"],
                    "accuracy": share(m["accuracy"]),
                    "recent": f"{share(m['recentAccuracy'])} of {m['recentFeedbacks']}",
                    "exp3 weight": f"{m['exp3Weight']:.3f}",
                    "exp4 weight": f"{m['exp4Weight']:.3f}",
                }
                for m in stats["models"]
            ]
            columns = ["model", "feedbacks", "accuracy", "recent", "exp3 weight", "exp4 weight"]
            print(f"app {args.app}: selection {stats['policy']}")
            print_table(rows, columns, empty="no feedback yet")
            return
        if args.query_id is None or (args.label is None) == (args.reward is None):
            raise UsageProblem("give a query id and either --label (one, or one per row) or --reward")
        label = args.label[0] if args.label is not None and len(args.label) == 1 else args.label
        reply = client.feedback(args.query_id, args.app, label=label, reward=args.reward)
    if wants_json(args):
        print_json(reply)
        return
    rewards = ", ".join(f"{model}={reward:g}" for model, reward in reply["rewards"].items())
    again = " (given before: nothing changed)" if reply["duplicate"] else ""
    print(f"query {reply['queryId']} ({reply['policy']}): {rewards or 'no model rewarded'}{again}")


@app.command("feedback")
def feedback(
    context: typer.Context,
    app_id: AppOption,
    query_id: Annotated[
        str | None, typer.Argument(metavar="QUERY_ID", help="the queryId of the query's reply")
    ] = None,
    more_labels: Annotated[
        list[int] | None,
        typer.Argument(
            metavar="LABEL",
            help="the other rows' labels after --label (--label 3 1 4)",
            show_default=False,
        ),
    ] = None,
    label: Annotated[
        list[int] | None, typer.Option(help="the true class (one, or one per row: --label 3 1 4)")
    ] = None,
    reward: Annotated[
        float | None, typer.Option(help="how good the reply was, 0..1 (instead of a label)")
    ] = None,
    stats: Annotated[bool, typer.Option("--stats", help="per model: feedbacks, accuracy, weights")] = False,
) -> None:
    """The true label (or a reward) of an answered query; --stats: each model's live accuracy."""
    if more_labels and label is None:
        raise typer.BadParameter(f"got {more_labels}: labels go after --label", param_hint="LABEL")
    labels = [*label, *(more_labels or [])] if label is not None else None
    session_of(context).run(
        "feedback", _cmd_feedback, app=app_id, query_id=query_id, label=labels, reward=reward, stats=stats
    )


def _cmd_selection(args: Any) -> None:
    with open_client(args) as client:
        policy = client.set_selection(args.app, args.policy) if args.policy else client.selection(args.app)
    if wants_json(args):
        print_json({"appID": args.app, "policy": policy})
    else:
        print(f"app {args.app}: selection {policy}")


@app.command("selection")
def selection(
    context: typer.Context,
    app_id: AppOption,
    policy: Annotated[
        Literal["infaas", "exp3", "exp4"] | None, typer.Option(help="set it to this policy")
    ] = None,
) -> None:
    """The app's selection policy (infaas, exp3, exp4): show it, or set it with --policy."""
    session_of(context).run("selection", _cmd_selection, app=app_id, policy=policy)
