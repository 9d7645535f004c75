"""The ``celery-fair`` command line (also ``python -m celery_fair``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._version import __version__
from .core import key_label
from .core.lanes import DEFAULT_LANES
from .errors import FairError, StoreUnavailable, TraceError
from .routing import DEFAULT_SHARDS
from .sim import (
    bundled_examples,
    format_table,
    load_bundled,
    parse_trace,
    simulate,
    with_overrides,
)
from .store.base import conflict_of

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="celery-fair", description="Fair dispatch for Celery: tools around the scheduler."
    )
    parser.add_argument("--version", action="version", version=f"celery-fair {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    sim = verbs.add_parser(
        "simulate",
        help="run the scheduler over a trace in simulated time (what-if capacity planning)",
        description="Run the scheduling core over a JSON trace in simulated time and print the "
        "start and finish of every job, with a per-fairness-key summary. "
        "See docs/simulator.md for the trace format.",
    )
    source = sim.add_mutually_exclusive_group(required=True)
    source.add_argument("trace", nargs="?", help="path of a JSON trace, or - for stdin")
    source.add_argument(
        "--example", choices=bundled_examples(), help="run a trace bundled with the package"
    )
    sim.add_argument(
        "--format", choices=("json", "table"), default="json", help="output format (default json)"
    )
    sim.add_argument(
        "--config",
        metavar="ALT",
        help="an alternative configuration (.toml or .json: capacity, types, tier_caps, alpha, "
        "lifecycle) to run beside the trace's own",
    )
    sim.add_argument(
        "--plot",
        metavar="OUT",
        help="draw slots over time by key and each key's waits to OUT (.png, .svg or .html)",
    )
    store = verbs.add_parser(
        "store",
        help="show what a fleet's shared store holds now (workers, running jobs, conflicts)",
        description="Read a fleet's shared state in Redis, changing nothing: live workers and "
        "their leases, running jobs, counts by tier and type, conflicts held, and the "
        "accumulated costs of the keys that run. See docs/operations.md.",
    )
    store.add_argument("url", help="the store's Redis: redis://, rediss://, redis+cluster://, "
                       "sentinel://...?master_name=...")  # fmt: skip
    store.add_argument("--prefix", default="celery_fair", help="fair_store_prefix of the fleet")
    store.add_argument(
        "--format", choices=("json", "table"), default="table", help="output format (default table)"
    )
    shards = verbs.add_parser(
        "shards",
        help="show how many messages wait in queues and their fair shards, and whose they are",
        description="Read a broker's queues and their shard queues, changing nothing: the "
        "messages waiting in each, its consumers (RabbitMQ), and the fairness keys of the "
        "oldest messages (Redis). See docs/operations.md#fair-shard-queues.",
    )
    shards.add_argument("url", help="the broker: redis://..., amqp://...")
    shards.add_argument("queues", nargs="+", metavar="QUEUE", help="queues (not shards)")
    shards.add_argument("--shards", type=int, default=DEFAULT_SHARDS, help="fair_shards")
    shards.add_argument(
        "--lanes",
        type=int,
        default=DEFAULT_LANES,
        help="fair_lanes (lanes with messages waiting are listed)",
    )
    shards.add_argument(
        "--key-prefix", default="", help="the Redis transport's global_keyprefix, if any"
    )
    shards.add_argument(
        "--sample", type=int, default=200, help="oldest messages per list to read keys from"
    )
    shards.add_argument(
        "--format", choices=("json", "table"), default="table", help="output format (default table)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (2 for bad input, 1 if unreachable)."""
    args = _parser().parse_args(argv)
    if args.verb == "store":
        return _store(args.url, args.prefix, args.format)
    if args.verb == "shards":
        return _shards(args)
    return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    try:
        data = load_bundled(args.example) if args.example else _read_json(args.trace)
        runs = [("current", parse_trace(data))]
        if args.config:
            runs.append(
                ("alternative", parse_trace(with_overrides(data, _read_config(args.config))))
            )
        results = [
            (label, trace, simulate(trace, _progress(label, trace))) for label, trace in runs
        ]
        if args.plot:
            from .plot import plot

            plot(results, args.plot)
    except FairError as exc:
        print(f"celery-fair simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.format == "table":
        for label, trace, result in results:
            if len(results) > 1:
                print(f"== {label}")
            print(format_table(trace, result))
    elif len(results) == 1:
        results[0][2].write_json(sys.stdout)
    else:
        from .plot import describe

        json.dump(describe(results), sys.stdout, indent=1)
        print()
    return 0


def _read_config(path: str) -> object:
    if path.endswith(".toml"):
        try:
            import tomllib
        except ImportError:  # Python 3.10
            raise TraceError("--config: reading TOML needs Python 3.11; use a .json file") from None
        try:
            with open(path, "rb") as f:
                return tomllib.load(f)
        except OSError as exc:
            raise TraceError(f"cannot read {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise TraceError(f"{path} is not valid TOML: {exc}") from None
    return _read_json(path)


def _progress(label: str, trace: object) -> Any:
    """A progress bar on stderr for long traces, when it is a terminal and rich is there."""
    jobs = len(getattr(trace, "jobs", ()))
    if jobs < 20_000 or not sys.stderr.isatty():
        return None
    try:
        from rich.progress import Progress
    except ImportError:
        return None
    bar = Progress(transient=True)
    task = bar.add_task(f"simulating ({label})", total=jobs)
    bar.start()

    def advance(done: int, total: int) -> None:
        bar.update(task, completed=done)
        if done >= total:
            bar.stop()

    return advance


def _store(url: str, prefix: str, form: str) -> int:
    from .settings import redact_url
    from .store.redis import RedisStore

    try:
        store = RedisStore.from_url(url, prefix=prefix)
        try:
            state = store.inspect()
        finally:
            store.close()
    except StoreUnavailable as exc:
        print(f"celery-fair store: {exc}", file=sys.stderr)
        return 1
    except FairError as exc:
        print(f"celery-fair store: error: {exc}", file=sys.stderr)
        return 2
    if form == "json":
        json.dump(state, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        print(format_store(state, f"{redact_url(url)} prefix {prefix}"))
    return 0


def _shards(args: argparse.Namespace) -> int:
    from kombu.connection import Connection

    from .queues import format_depths, queue_depths
    from .settings import redact_url

    if args.shards < 1 or args.sample < 0 or args.lanes < 0:
        print(
            "celery-fair shards: error: --shards must be >= 1, --sample and --lanes >= 0",
            file=sys.stderr,
        )
        return 2
    options = {"global_keyprefix": args.key_prefix} if args.key_prefix else {}
    try:
        with Connection(args.url, transport_options=options, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
            depths = queue_depths(conn, args.queues, args.shards, args.sample, args.lanes)
    except Exception as exc:  # unreachable, refused, a bad URL: say so, never a traceback
        print(f"celery-fair shards: {redact_url(args.url)}: {exc}", file=sys.stderr)
        return 1
    if args.format == "json":
        json.dump(depths, sys.stdout, indent=1)
        print()
    else:
        print(format_depths(depths))
    return 0


def _lease(left: float) -> str:
    """A worker's lease as ``format_store`` shows it: the time left, or, once it has run out
    (the store takes a worker whose lease ended before now for dead, and reclaims its jobs at
    the next housekeeping), how long ago."""
    if left < 0:
        return f"lease expired {-left:.1f} s ago (dead)"
    return f"lease {left:.1f} s left"


def format_store(state: dict[str, Any], where: str) -> str:
    """``RedisStore.inspect()``'s answer as text for people."""
    if state["schema"] is None:
        return f"{where}: empty (no worker has used this prefix, or Redis lost it)"
    now = state["now"]
    lines = [f"{where}: schema {state['schema']}, epoch {state['epoch']}, token {state['token']}"]
    if state["recovering_until"] is not None and state["recovering_until"] > now:
        left = state["recovering_until"] - now
        lines.append(f"recovering: nothing is admitted for {left:.1f} s more")
    lines.append(f"workers ({len(state['workers'])}):")
    lines += [
        f"  {w['worker']}  {w['jobs']} running  {_lease(w['lease_until'] - now)}"
        for w in sorted(state["workers"], key=lambda w: w["worker"])
    ]
    by_tier = sorted(state["tiers"].items(), key=lambda item: -int(item[0]))
    tiers = ", ".join(f"{p}: {n}" for p, n in by_tier if n)
    types = ", ".join(f"{t}: {n}" for t, n in sorted(state["types"].items()) if n)
    lines.append(f"running by tier: {tiers or '-'}; by type: {types or '-'}")
    lines.append(f"jobs ({len(state['jobs'])}):")
    for j in sorted(state["jobs"], key=lambda j: (-j["priority"], j["since"])):
        conflict = _conflict(j["conflict"])
        lines.append(
            f"  {j['uid']}  {j['type']} (tier {j['priority']})  "
            f"key {key_label(j['fairness_key'])}  "
            f"on {j['worker']}  token {j['token']}  for {now - j['since']:.1f} s"
            + (f"  holds {conflict}" if conflict else "")
        )
    held = ", ".join(f"{_conflict(c)} by {uid}" for c, uid in sorted(state["conflicts"].items()))
    lines.append(f"conflicts held: {held or '-'}")
    by_cost = sorted(state["costs"].items(), key=lambda item: -item[1])
    costs = ", ".join(f"{key_label(k)} {v:g}" for k, v in by_cost)
    lines.append(f"accumulated cost of the keys running: {costs or '-'}")
    lanes = state.get("lanes") or {"size": 0, "keys": {}}
    laned = ", ".join(f"{key_label(k)} {j}" for k, j in sorted(lanes["keys"].items()))
    lines.append(f"lanes: {lanes['size']} agreed; keys in a lane: {laned or '-'}")
    lines.append(
        f"kept: {state['keys']} keys' costs, {state['estimates']} estimates, "
        f"{state['tombstones']} tombstones"
    )
    return "\n".join(lines)


def _conflict(field: str) -> str:
    """A conflict field as ``group/job_id``."""
    named = conflict_of(field)
    return field if named is None else "/".join(named)


def _read_json(path: str) -> object:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not valid JSON: {exc}") from None
