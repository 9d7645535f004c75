"""The ``celery-fair`` command line (also ``python -m celery_fair``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from . import __version__
from .errors import FairError, TraceError
from .sim import bundled_examples, format_table, load_bundled, parse_trace, simulate

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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit status (2 for bad input)."""
    args = _parser().parse_args(argv)
    try:
        data = load_bundled(args.example) if args.example else _read_json(args.trace)
        trace = parse_trace(data)
        result = simulate(trace)
    except FairError as exc:
        print(f"celery-fair simulate: error: {exc}", file=sys.stderr)
        return 2
    if args.format == "table":
        print(format_table(trace, result))
    else:
        json.dump(result.to_json(), sys.stdout, indent=1)
        print()
    return 0


def _read_json(path: str) -> object:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text("utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path} is not valid JSON: {exc}") from None
