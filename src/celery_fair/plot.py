"""Pictures of simulations: ``celery-fair simulate TRACE --config ALT --plot out.png``.

For each run (today's configuration, and an alternative), a timeline of the slots over time,
stacked by fairness key (the heaviest keys by slot-time, the rest as "other"), and, for both
runs together, each heavy key's wait distribution (an ECDF: the share of its jobs that started
within a given wait). PNG and SVG come from matplotlib (the ``plot`` extra); HTML is a page
with the SVG and the per-key table.

The data are computed here from the trace and the results (``slots_by_key``, ``waits_by_key``),
so they are tested without drawing anything.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .errors import ConfigurationError
from .sim import SimResult, Trace

__all__ = ["ecdf", "figure", "plot", "slots_by_key", "waits_by_key"]

#: Keys drawn by name; the others are summed as "other".
HEAVY_KEYS = 8


def heavy_keys(trace: Trace, result: SimResult, top: int = HEAVY_KEYS) -> list[str]:
    """The keys with the most slot-time, heaviest first."""
    keys = result.summary["keys"]
    return sorted(keys, key=lambda k: (-keys[k]["slot_time"], k))[:top]


def slots_by_key(
    trace: Trace, result: SimResult, keys: Sequence[str]
) -> tuple[list[float], dict[str, list[int]]]:
    """Slots in use over time by key: the instants where anything starts or ends, and for each
    of ``keys`` (and ``"other"``) how many of its jobs run from that instant on. O(n log n)."""
    events: list[tuple[float, int, str]] = []
    named = set(keys)
    for job, out in zip(trace.jobs, result.jobs, strict=True):
        if out.start is None or out.finish is None or out.finish == out.start:
            continue
        key = job.fairness_key if job.fairness_key in named else "other"
        events.append((out.start, 1, key))
        events.append((out.finish, -1, key))
    events.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    lanes = [*keys, "other"]
    running = dict.fromkeys(lanes, 0)
    times: list[float] = []
    series: dict[str, list[int]] = {k: [] for k in lanes}
    i = 0
    while i < len(events):
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            running[events[i][2]] += events[i][1]
            i += 1
        times.append(t)
        for k in lanes:
            series[k].append(running[k])
    return times, series


def waits_by_key(trace: Trace, result: SimResult, keys: Sequence[str]) -> dict[str, list[float]]:
    """Each key's waits (start - arrival) of the jobs that started, sorted."""
    named = set(keys)
    out: dict[str, list[float]] = {k: [] for k in keys}
    for job, o in zip(trace.jobs, result.jobs, strict=True):
        if o.start is not None and job.fairness_key in named:
            out[job.fairness_key].append(o.start - job.arrival)
    for waits in out.values():
        waits.sort()
    return out


def plot(runs: Sequence[tuple[str, Trace, SimResult]], path: str | Path) -> None:
    """Draw ``runs`` (label, trace, result) to ``path`` (.png, .svg or .html)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg", ".html"):
        raise ConfigurationError(f"--plot: expected a .png, .svg or .html file, got {path.name}")
    plt = _pyplot()
    fig = figure(runs)
    if suffix == ".html":
        svg = io.StringIO()
        fig.savefig(svg, format="svg")
        _, trace0, result0 = runs[0]
        path.write_text(_page(svg.getvalue(), runs, heavy_keys(trace0, result0)), encoding="utf-8")
    else:
        fig.savefig(path, dpi=110)
    plt.close(fig)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigurationError(
            "--plot needs matplotlib: pip install 'celery-fair[plot]'"
        ) from None
    return plt


def figure(runs: Sequence[tuple[str, Trace, SimResult]]) -> Any:
    """The matplotlib figure of ``runs``: one timeline per run, then the waits of all runs.
    Each legend sits to the right of its chart, never over the data."""
    plt = _pyplot()
    _, trace0, result0 = runs[0]
    keys = heavy_keys(trace0, result0)
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(keys)}
    colours["other"] = (0.75, 0.75, 0.75, 1.0)
    fig, axes = plt.subplots(
        len(runs) + 1, 1, figsize=(13, 3.2 * (len(runs) + 1)), layout="constrained"
    )
    outside = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0}
    for ax, (label, trace, result) in zip(axes, runs, strict=False):
        times, series = slots_by_key(trace, result, keys)
        lanes = [*keys, "other"]
        if times:
            ax.stackplot(
                times,
                *(series[k] for k in lanes),
                labels=[_label(k) for k in lanes],
                colors=[colours[k] for k in lanes],
                step="post",
            )
        ax.axhline(trace.capacity, color="black", linewidth=0.8, linestyle=":")
        ax.set_title(f"{label}: slots in use by fairness key (capacity {trace.capacity})")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("slots")
        ax.legend(fontsize="small", **outside)
    ax = axes[-1]
    styles = ("-", "--", ":", "-.")
    waits = [waits_by_key(trace, result, keys) for _, trace, result in runs]
    # every line runs to the longest wait, so that a key whose jobs all started early (or
    # that has one job) shows as a line at 1, not as a point nobody sees
    longest = max((w[-1] for run in waits for w in run.values() if w), default=0.0)
    for n, (label, _, _) in enumerate(runs):
        for k in keys:
            xs, ys = ecdf(waits[n][k], longest)
            if xs:
                ax.step(xs, ys, where="post", color=colours[k], linestyle=styles[n % 4],
                        label=f"{_label(k)} ({label})")  # fmt: skip
                # a dot where each job started, so that one job is seen as one
                ax.plot(xs[1 : len(waits[n][k]) + 1], ys[1 : len(waits[n][k]) + 1],
                        linestyle="none", marker="o", markersize=3, color=colours[k])  # fmt: skip
    ax.margins(x=0.04)
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Wait from arrival to start, per key: share of its jobs started within x")
    ax.set_xlabel("wait (s)")
    ax.set_ylabel("share of jobs")
    ax.legend(fontsize="x-small", ncol=1 + len(keys) * len(runs) // 12, **outside)
    return fig


def ecdf(waits: Sequence[float], until: float) -> tuple[list[float], list[float]]:
    """The steps of the share of jobs started within x, for sorted ``waits``: from 0 at the
    first wait up to 1 at the last, then level to ``until`` (for ``step(where="post")``).

    >>> ecdf([3.0], 10.0)
    ([3.0, 3.0, 10.0], [0.0, 1.0, 1.0])
    """
    if not waits:
        return [], []
    xs = [waits[0], *waits]
    ys = [0.0, *((i + 1) / len(waits) for i in range(len(waits)))]
    if until > waits[-1]:
        xs.append(until)
        ys.append(1.0)
    return xs, ys


def _label(key: str) -> str:
    from .core import key_label

    return key_label(key)


def _page(svg: str, runs: Sequence[tuple[str, Trace, SimResult]], keys: Sequence[str]) -> str:
    head = "".join(
        f"<th>{html.escape(label)} {h}</th>" for label, _, _ in runs for h in ("p50", "p99")
    )
    rows = []
    for k in keys:
        cells = []
        for _, _, result in runs:
            s = result.summary["keys"].get(k, {})
            for name in ("wait_p50", "wait_p99"):
                v = s.get(name)
                cells.append(f"<td>{'-' if v is None else f'{v:.2f}'}</td>")
        rows.append(f"<tr><td>{html.escape(_label(k))}</td>{''.join(cells)}</tr>")
    return (
        "<!doctype html><meta charset='utf-8'><title>celery-fair simulation</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}</style>"
        f"<h1>celery-fair simulation</h1>{svg}"
        f"<h2>Waits per key (s)</h2><table><tr><th>key</th>{head}</tr>{''.join(rows)}</table>"
    )


def describe(runs: Sequence[tuple[str, Trace, SimResult]]) -> list[dict[str, Any]]:
    """Per run: label, makespan and per-key summary, for ``--format json`` with ``--config``."""
    return [{"label": label, **result.to_json()} for label, _, result in runs]
