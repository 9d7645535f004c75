"""The what-if simulator: a trace in, the core's decisions in simulated time out.

Time jumps from event to event. At each instant, completions are applied first (in the order
those jobs were admitted, each teaching the estimate ``elapsed = duration``), then pauses and
resumes (in trace order), then arrivals (in trace order), then jobs are admitted one at a time
until nothing more is admissible. A job that
can never run gets ``start`` and ``finish`` of ``None``. The format is documented in
``docs/simulator.md``.
"""

from __future__ import annotations

import heapq
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, TextIO

from .core import (
    Aging,
    CostLifecycle,
    JobType,
    KeyPolicies,
    Scheduler,
    SchedulerConfig,
    SimClock,
    key_label,
)
from .core.types import TYPE_OPTIONS
from .errors import ConfigurationError, TraceError

__all__ = [
    "JobOutcome",
    "SimResult",
    "Trace",
    "TraceJob",
    "TracePause",
    "bundled_examples",
    "format_table",
    "load_bundled",
    "parse_trace",
    "simulate",
]

_TYPE_FIELDS = set(TYPE_OPTIONS)
_JOB_FIELDS = {
    "name",
    "type",
    "job_id",
    "fairness_key",
    "arrival",
    "duration",
    "cost",
    "priority",
}
_TOP_FIELDS = {
    "capacity",
    "types",
    "jobs",
    "alpha",
    "tier_caps",
    "lifecycle",
    "keys",
    "pauses",
    "aging",
    "allocation_caps",
    "priority_scope",
    "key_separator",
}
_PAUSE_FIELDS = {"key", "type", "tenant", "at", "until"}
_LIFECYCLE_FIELDS = {"cost_ttl", "estimate_ttl", "reset_interval", "advance_idle"}


@dataclass(frozen=True, slots=True)
class TraceJob:
    name: str
    type: str
    job_id: str | None
    fairness_key: str
    arrival: float
    duration: float
    cost: float | None
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class TracePause:
    """A fairness key (``kind`` ``"key"``), a job type (``"type"``) or a tenant (``"tenant"``,
    with ``key_separator``) paused from ``at`` until ``until`` (``None``: to the end)."""

    kind: str
    name: str
    at: float
    until: float | None


@dataclass(frozen=True, slots=True)
class Trace:
    capacity: int
    types: tuple[JobType, ...]
    jobs: tuple[TraceJob, ...]
    config: SchedulerConfig
    pauses: tuple[TracePause, ...] = ()


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """When a job started and finished; with aging, its effective priority when it started."""

    name: str
    start: float | None
    finish: float | None
    effective_priority: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "start": self.start, "finish": self.finish}
        if self.effective_priority is not None:
            out["effective_priority"] = self.effective_priority
        return out


@dataclass(frozen=True, slots=True)
class SimResult:
    jobs: tuple[JobOutcome, ...]
    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": [j.to_json() for j in self.jobs],
            "summary": self.summary,
        }

    def write_json(self, out: TextIO) -> None:
        """``to_json()`` as JSON text, one job per line, each line as ``json.dumps`` writes
        that job's ``to_json()``. The lines are made here, not by the json module (a dict and
        an encoder call a job were a twentieth of a 100,000-job run; the json module has no C
        encoder for indented output at all); a test holds the two equal."""
        dumps = json.dumps
        out.write('{\n "jobs": [\n')
        lines = []
        for j in self.jobs:
            start, finish, effective = j.start, j.finish, j.effective_priority
            line = (
                f'  {{"name": {dumps(j.name)}, '
                f'"start": {"null" if start is None else _json_number(start)}, '
                f'"finish": {"null" if finish is None else _json_number(finish)}'
            )
            if effective is not None:
                line += f', "effective_priority": {effective}'
            lines.append(line + "}")
        out.write(",\n".join(lines))
        end = "\n ]," if lines else " ],"
        summary = dumps(self.summary, indent=1).replace("\n", "\n ")
        out.write(f'{end}\n "summary": {summary}\n}}\n')


def _json_number(value: float) -> str:
    """A finite number as the json module writes it (``float.__repr__``, ``int.__repr__``)."""
    return float.__repr__(value) if type(value) is float else json.dumps(value)


# -- parsing -----------------------------------------------------------------------------


def parse_trace(data: object, *, warn: Any = None) -> Trace:
    """Validate a decoded JSON trace and build a ``Trace``.

    Unknown fields are reported through ``warn(message)`` (stderr by default) and ignored.

    Raises:
        TraceError: The trace does not follow the format; the message names the field.
    """
    warn = warn or (lambda message: print(f"warning: {message}", file=sys.stderr))
    top = _mapping(data, "trace")
    _unknown(top, _TOP_FIELDS, "trace", warn)
    capacity = top.get("capacity")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise TraceError(f"capacity: must be an int >= 0, got {capacity!r}")
    types = []
    for name, spec in _mapping(top.get("types", {}), "types").items():
        where = f"types[{name!r}]"
        spec = _mapping(spec, where)
        _unknown(spec, _TYPE_FIELDS, where, warn)
        if "priority" not in spec:
            raise TraceError(f"{where}.priority: required")
        try:
            types.append(
                JobType(
                    name=name,
                    priority=spec["priority"],
                    max_concurrency=spec.get("max_concurrency"),
                    conflict_group=spec.get("conflict_group") or "",
                    default_cost=spec.get("default_cost", 1),
                    aging=None if spec.get("aging") is None else Aging.from_mapping(spec["aging"]),
                    rate=spec.get("rate"),
                    burst=spec.get("burst"),
                    per=spec.get("per", "job"),
                )
            )
        except ConfigurationError as exc:
            raise TraceError(f"{where}: {exc}") from None
    known = {t.name for t in types}
    jobs = []
    names: set[str] = set()
    for i, raw in enumerate(_sequence(top.get("jobs", []), "jobs")):
        jobs.append(_parse_job(raw, f"jobs[{i}]", known, names, warn))
    pauses = tuple(
        _parse_pause(raw, f"pauses[{i}]", known, warn)
        for i, raw in enumerate(_sequence(top.get("pauses", []), "pauses"))
    )
    return Trace(capacity, tuple(types), tuple(jobs), _parse_config(top, capacity, warn), pauses)


def _parse_pause(raw: object, where: str, known: set[str], warn: Any) -> TracePause:
    spec = _mapping(raw, where)
    _unknown(spec, _PAUSE_FIELDS, where, warn)
    kinds = [kind for kind in ("key", "type", "tenant") if kind in spec]
    if len(kinds) != 1:
        raise TraceError(
            f"{where}: give exactly one of 'key' (a fairness key), 'type' and 'tenant'"
        )
    (kind,) = kinds
    name = spec[kind]
    if not isinstance(name, str):
        raise TraceError(f"{where}.{kind}: must be a string, got {name!r}")
    if kind == "type" and name not in known:
        raise TraceError(f"{where}.type: {name!r} is not one of the trace's types {sorted(known)}")
    at = _number(spec.get("at"), where, "at")
    until = spec.get("until")
    if until is not None:
        until = _number(until, where, "until")
        if until < at:
            raise TraceError(f"{where}.until: {until!r} is before at ({at!r})")
    return TracePause(kind, name, at, until)


def _parse_job(raw: object, where: str, known: set[str], names: set[str], warn: Any) -> TraceJob:
    spec = _mapping(raw, where)
    _unknown(spec, _JOB_FIELDS, where, warn)
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise TraceError(f"{where}.name: must be a non-empty string, got {name!r}")
    if name in names:
        raise TraceError(f"{where}.name: {name!r} is used by an earlier job; names are unique")
    names.add(name)
    jtype = spec.get("type")
    if jtype not in known:
        raise TraceError(f"{where}.type: {jtype!r} is not one of the trace's types {sorted(known)}")
    job_id = spec.get("job_id")
    if job_id is not None and not isinstance(job_id, str):
        raise TraceError(f"{where}.job_id: must be a string or null, got {job_id!r}")
    key = spec.get("fairness_key", "")
    if key is None:
        key = ""
    if not isinstance(key, str):
        raise TraceError(f"{where}.fairness_key: must be a string, got {key!r}")
    arrival = _number(spec.get("arrival"), where, "arrival")
    duration = _number(spec.get("duration"), where, "duration")
    cost = spec.get("cost")
    if cost is not None:
        cost = _number(cost, where, "cost")
    priority = spec.get("priority")
    if priority is not None and not (type(priority) is int and priority >= 1):
        raise TraceError(f"{where}.priority: must be a positive int or null, got {priority!r}")
    return TraceJob(name, str(jtype), job_id, key, arrival, duration, cost, priority)


def _parse_config(top: dict[str, Any], capacity: int, warn: Any) -> SchedulerConfig:
    tier_caps: dict[int, int | None] = {}
    for tier, cap in _mapping(top.get("tier_caps", {}), "tier_caps").items():
        try:
            tier_caps[int(tier)] = cap
        except ValueError:
            raise TraceError(f"tier_caps: tier {tier!r} is not an integer") from None
    lifecycle = CostLifecycle.never()
    if "lifecycle" in top:
        spec = _mapping(top["lifecycle"], "lifecycle")
        _unknown(spec, _LIFECYCLE_FIELDS, "lifecycle", warn)
        try:
            lifecycle = CostLifecycle(
                cost_ttl=spec.get("cost_ttl"),
                estimate_ttl=spec.get("estimate_ttl"),
                reset_interval=spec.get("reset_interval"),
                advance_idle=spec.get("advance_idle", False),
            )
        except ConfigurationError as exc:
            raise TraceError(f"lifecycle: {exc}") from None
    try:
        keys = KeyPolicies.from_mapping(_mapping(top.get("keys", {}), "keys"))
    except ConfigurationError as exc:
        raise TraceError(f"keys: {exc}") from None
    try:
        aging = None if top.get("aging") is None else Aging.from_mapping(top["aging"])
    except ConfigurationError as exc:
        raise TraceError(f"aging: {exc}") from None
    try:
        return SchedulerConfig(
            capacity=capacity,
            tier_caps=tier_caps,
            alpha=top.get("alpha", 0.3),
            lifecycle=lifecycle,
            keys=keys,
            aging=aging,
            allocation_caps=top.get("allocation_caps", False),
            priority_scope=top.get("priority_scope", "global"),
            key_separator=top.get("key_separator"),
        )
    except ConfigurationError as exc:
        raise TraceError(str(exc)) from None


def _mapping(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TraceError(f"{where}: must be an object, got {type(value).__name__}")
    return value


def _sequence(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise TraceError(f"{where}: must be a list, got {type(value).__name__}")
    return value


def _number(value: object, where: str, field: str) -> float:
    """``value`` if it is a finite number >= 0, else an error naming ``where.field`` (the name
    is made only then: a trace has a hundred thousand jobs)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise TraceError(f"{where}.{field}: must be a finite number >= 0, got {value!r}")
    return value


def _unknown(spec: dict[str, Any], allowed: set[str], where: str, warn: Any) -> None:
    if spec.keys() <= allowed:
        return
    for name in sorted(set(spec) - allowed):
        warn(f"{where}: unknown field {name!r} ignored")


# -- running -----------------------------------------------------------------------------


def simulate(trace: Trace, progress: Callable[[int, int], None] | None = None) -> SimResult:
    """Run the core over ``trace`` in simulated time; deterministic. ``progress(done, total)``
    is called every 4,096 arrivals, and once at the end."""
    clock = SimClock()
    scheduler = Scheduler(trace.config, clock, trace.types)
    jobs = trace.jobs
    n = len(jobs)
    order = sorted(range(n), key=lambda i: (jobs[i].arrival, i))
    start: list[float | None] = [None] * n
    finish: list[float | None] = [None] * n
    aged = trace.config.aging is not None or any(t.aging is not None for t in trace.types)
    # Time alone changes a decision with aging (a job turns urgent) or rate limits (a key's or
    # a type's bucket refills), with no job coming or going: the loop also steps to
    # ``next_rise``, and goes on while a key or type waits for its refill (aging alone rises
    # for ever: it ends the loop only with nothing else left, as before).
    rated = trace.config.keys.rated or any(t.rate is not None for t in trace.types)
    timed = aged or rated
    effective: list[int | None] = [None] * n
    running: list[tuple[float, int, int]] = []  # (finish, token, index)
    # Pauses and resumes as (time, pause's trace order, 0 pause / 1 resume, kind, name).
    pauses = trace.pauses
    changes = sorted(
        [(p.at, i, 0, p.kind, p.name) for i, p in enumerate(pauses)]
        + [(p.until, i, 1, p.kind, p.name) for i, p in enumerate(pauses) if p.until is not None]
    )
    change = 0
    nxt = 0
    while (
        nxt < n
        or running
        or (change < len(changes) and scheduler.pending)
        or (rated and scheduler.pending and scheduler.next_refill() is not None)
    ):
        t = min(
            jobs[order[nxt]].arrival if nxt < n else math.inf,
            running[0][0] if running else math.inf,
            changes[change][0] if change < len(changes) else math.inf,
        )
        rise = scheduler.next_rise() if timed and scheduler.pending else None
        if rise is not None and rise < t:
            t = rise
        clock.set(t)
        while running and running[0][0] <= t:
            done_at, _, index = heapq.heappop(running)
            finish[index] = done_at
            scheduler.complete(index, elapsed=jobs[index].duration)
        while change < len(changes) and changes[change][0] <= t:
            _, _, resume, kind, name = changes[change]
            change += 1
            if kind == "key":
                (scheduler.resume_key if resume else scheduler.pause_key)(name)
            elif kind == "tenant":
                (scheduler.resume_tenant if resume else scheduler.pause_tenant)(name)
            else:
                (scheduler.resume_type if resume else scheduler.pause_type)(name)
        while nxt < n and jobs[order[nxt]].arrival <= t:
            job = jobs[order[nxt]]
            scheduler.submit(
                order[nxt],
                job.type,
                job.job_id,
                job.fairness_key,
                arrival=job.arrival,
                cost=job.cost,
                priority=job.priority,
            )
            nxt += 1
            if progress is not None and not nxt & 4095:
                progress(nxt, n)
        for admission in scheduler.schedule():
            index = admission.uid  # type: ignore[assignment]
            start[index] = t
            if aged:
                effective[index] = admission.effective_priority
            heapq.heappush(running, (t + jobs[index].duration, admission.token, index))
    if progress is not None:
        progress(n, n)
    outcomes = tuple(
        JobOutcome(j.name, start[i], finish[i], effective[i]) for i, j in enumerate(jobs)
    )
    return SimResult(outcomes, summarise(jobs, outcomes))


#: What an alternative configuration (``simulate --config``) may change in a trace.
OVERRIDABLE = (
    "capacity",
    "types",
    "tier_caps",
    "alpha",
    "lifecycle",
    "keys",
    "pauses",
    "aging",
    "allocation_caps",
    "priority_scope",
    "key_separator",
)


def with_overrides(data: object, overrides: object) -> object:
    """``data`` (a decoded trace) with an alternative configuration on top: ``capacity``,
    ``alpha``, ``tier_caps``, ``lifecycle``, ``keys``, ``pauses``, ``aging``,
    ``allocation_caps``, ``priority_scope`` and ``key_separator`` replace the trace's;
    ``types`` are merged type by type, option by option (``{"repack": {"max_concurrency": 1}}``
    changes one cap). The jobs stay. The result is checked by ``parse_trace`` like any trace.

    Raises:
        TraceError: ``overrides`` is not a mapping of those names.
    """
    if not isinstance(overrides, dict):
        raise TraceError("config: expected a table of settings")
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise TraceError(f"config: unknown setting(s) {', '.join(unknown)}; "
                         f"expected some of {', '.join(OVERRIDABLE)}")  # fmt: skip
    if not isinstance(data, dict):
        return data  # parse_trace says what is wrong with it
    out = dict(data)
    for name, value in overrides.items():
        if name == "types" and isinstance(value, dict) and isinstance(data.get("types"), dict):
            types = {k: dict(v) if isinstance(v, dict) else v for k, v in data["types"].items()}
            for tname, options in value.items():
                if not isinstance(options, dict):
                    raise TraceError(f"config: types.{tname}: expected a table of options")
                base = types.get(tname)
                if not isinstance(base, dict) and "priority" not in options:
                    raise TraceError(
                        f"config: types.{tname}: not a type of the trace (a new type needs "
                        "its priority)"
                    )
                types[tname] = {**(base if isinstance(base, dict) else {}), **options}
            out["types"] = types
        else:
            out[name] = value
    return out


def summarise(jobs: tuple[TraceJob, ...], outcomes: tuple[JobOutcome, ...]) -> dict[str, Any]:
    """Per fairness key: counts, wait percentiles (nearest rank) and share of slot-time."""
    waits: dict[str, list[float]] = {}
    counts: dict[str, int] = {}
    slot_time: dict[str, float] = {}
    for job, outcome in zip(jobs, outcomes, strict=True):
        key = job.fairness_key
        counts[key] = counts.get(key, 0) + 1
        waits.setdefault(key, [])
        slot_time.setdefault(key, 0)
        if outcome.start is not None:
            waits[key].append(outcome.start - job.arrival)
            slot_time[key] += job.duration
    total = sum(slot_time.values())
    keys = {}
    for key in sorted(counts):
        w = sorted(waits[key])
        keys[key] = {
            "jobs": counts[key],
            "started": len(w),
            "never_started": counts[key] - len(w),
            "wait_p50": _percentile(w, 50),
            "wait_p99": _percentile(w, 99),
            "wait_max": w[-1] if w else None,
            "slot_time": slot_time[key],
            "slot_share": slot_time[key] / total if total else 0.0,
        }
    finishes = [o.finish for o in outcomes if o.finish is not None]
    return {"makespan": max(finishes) if finishes else None, "keys": keys}


def _percentile(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


# -- presentation ------------------------------------------------------------------------


def format_table(trace: Trace, result: SimResult) -> str:
    """The result as two plain-text tables: jobs in trace order, then per fairness key."""
    aged = trace.config.aging is not None or any(t.aging is not None for t in trace.types)
    priority = {t.name: t.priority for t in trace.types}
    header: tuple[str, ...] = ("job", "type", "job_id", "key", "arrival", "start", "finish", "wait")
    rows: list[tuple[str, ...]] = [(*header, "priority") if aged else header]
    for job, out in zip(trace.jobs, result.jobs, strict=True):
        wait = None if out.start is None else out.start - job.arrival
        row: tuple[str, ...] = (
            job.name,
            job.type,
            "-" if job.job_id is None else job.job_id,
            _key_label(job.fairness_key),
            _fmt(job.arrival),
            _fmt(out.start),
            _fmt(out.finish),
            _fmt(wait),
        )
        if aged:  # its own priority, and where aging had raised it when it started
            base = priority[job.type]
            eff = out.effective_priority
            row += (f"{base}" if eff is None or eff == base else f"{base} -> {eff}",)
        rows.append(row)
    lines = _table(rows)
    lines.append("")
    rows = [("key", "jobs", "started", "wait p50", "wait p99", "wait max", "slot-time", "share")]
    for key, s in result.summary["keys"].items():
        rows.append(
            (
                _key_label(key),
                str(s["jobs"]),
                str(s["started"]),
                _fmt(s["wait_p50"]),
                _fmt(s["wait_p99"]),
                _fmt(s["wait_max"]),
                _fmt(s["slot_time"]),
                f"{100 * s['slot_share']:.1f}%",
            )
        )
    lines.extend(_table(rows))
    lines.append("")
    lines.append(f"makespan: {_fmt(result.summary['makespan'])}")
    return "\n".join(lines)


def _key_label(key: str) -> str:
    return key_label(key)


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    if float(value).is_integer():
        return str(int(value))
    return f"{value:.3f}"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for n, row in enumerate(rows):
        out.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


# -- bundled examples --------------------------------------------------------------------


def bundled_examples() -> list[str]:
    """Names of the traces shipped with the package."""
    folder = resources.files("celery_fair").joinpath("traces")
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def load_bundled(name: str) -> object:
    """The decoded JSON of the bundled trace ``name``."""
    if name not in bundled_examples():
        raise TraceError(f"no bundled example {name!r}; choose from {bundled_examples()}")
    text = resources.files("celery_fair").joinpath("traces", f"{name}.json").read_text("utf-8")
    return json.loads(text)
