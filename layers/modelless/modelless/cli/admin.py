"""Admin commands (the admin key: $MODELLESS_ADMIN_KEY or the embedded stack's): create-app,
allow-buckets, workers, cache."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from modelless.cli.app import app, session_of
from modelless.cli.core import open_client, print_json, save_app_key, state_dir, wants_json
from modelless.cli.text import instance_summary


def _cmd_create_app(args: Any) -> None:
    with open_client(args) as client:
        key = client.create_app(args.app_id)
    save_app_key(args.app_id, key)
    saved = state_dir() / "credentials.json"
    if wants_json(args):
        print_json({"appID": args.app_id, "apiKey": key, "savedTo": str(saved)})
    else:
        print(f"app {args.app_id} created; API key (saved to {saved}):\n{key}")


@app.command("create-app")
def create_app(
    context: typer.Context, app_id: Annotated[str, typer.Argument(help="the new app's id")]
) -> None:
    """Create an app and get its API key (admin)."""
    session_of(context).run("create-app", _cmd_create_app, app_id=app_id)


def _cmd_allow_buckets(args: Any) -> None:
    with open_client(args) as client:
        buckets = client.set_offline_buckets(args.app_id, args.buckets)
    if wants_json(args):
        print_json({"appID": args.app_id, "buckets": buckets})
    else:
        print(f"app {args.app_id}: offline jobs may use {', '.join(buckets) or 'no bucket'}")


@app.command("allow-buckets")
def allow_buckets(
    context: typer.Context,
    app_id: Annotated[str, typer.Argument(help="the app")],
    buckets: Annotated[list[str] | None, typer.Argument(help="bucket names (none: no bucket)")] = None,
) -> None:
    """Admin: the S3 buckets an app's offline jobs may use."""
    session_of(context).run("allow-buckets", _cmd_allow_buckets, app_id=app_id, buckets=list(buckets or []))


def _cmd_workers(args: Any) -> None:
    with open_client(args) as client:
        # An app's key sees its own instances; without --app, the admin key sees every worker.
        workers = client.workers(admin=args.app is None)
    if wants_json(args):
        print_json({"workers": workers})
        return
    for worker in workers:
        loaded = ", ".join(instance_summary(i) for i in worker["instances"])
        print(
            f"{worker['worker_id']:12} {worker['pool']:10} util={worker['utilisation']:.2f} "
            f"free={worker['free_slots']} {loaded}"
        )


@app.command("workers")
def workers(
    context: typer.Context,
    app_id: Annotated[
        str | None,
        typer.Option("--app", help="the app whose instances to show (its key); default: all (admin key)"),
    ] = None,
) -> None:
    """Live worker state: an app's own instances (--app), or every worker (admin key)."""
    session_of(context).run("workers", _cmd_workers, app=app_id)


def _cmd_cache(args: Any) -> None:
    with open_client(args) as client:
        if args.clear:
            client.clear_cache()
        stats = client.cache_stats()
    if wants_json(args):
        print_json(stats)
        return
    if not stats["enabled"]:
        print("prediction cache: off (MODELLESS_PREDICTION_CACHE_ENABLED)")
        return
    print(
        f"prediction cache ({stats['backend']}): {stats['hits']} hits, {stats['misses']} misses "
        f"(hit rate {stats['hitRate']:.1%}); {stats['entries']} entries, "
        f"{stats['bytesUsed'] / 2**20:.2f} of {stats['maxBytes'] / 2**20:.2f} MiB; "
        f"{stats['evictions']} evictions"
    )


@app.command("cache")
def cache(
    context: typer.Context,
    clear: Annotated[bool, typer.Option("--clear", help="empty it (and reset its counters) first")] = False,
) -> None:
    """Admin: the prediction cache's hit rate, size and evictions."""
    session_of(context).run("cache", _cmd_cache, clear=clear)
