"""Prometheus metrics of one worker: an observer of its events, and a look at its state.

``WorkerMetrics`` is an ``Observer`` (observe.py): counters and histograms move as events
happen. Gauges (held, blocked by reason, running, the store's mode) are read when Prometheus
scrapes, from the gate, under its lock; nothing is counted twice and nothing is written per
job that a scrape could compute. Everything lives in a registry of its own, served by one
HTTP server per worker main process (``fair_metrics_port``); the prefork children run task
bodies only, so the main process sees every event (no multiprocess mode needed).

Labels are bounded: job types (registered), tiers (configured priorities), reasons, store
call kinds and queues (consumed). A job id is never a label, and a fairness key only in one
gauge, the head of each key's line, for the ``fair_metrics_top_keys`` keys that have waited
longest (the rest as ``other``; 0 names none).

docs/metrics.md lists every metric with an example query and alert.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import ConfigurationError
from .observe import Observer

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = ["GateLook", "WorkerMetrics", "prometheus", "serve"]

#: Queue wait buckets (seconds): from a free slot's few milliseconds to half an hour.
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600,
                1800)  # fmt: skip
#: Store round trip buckets (seconds).
CALL_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
#: Decision time buckets (seconds): the core decides in microseconds.
DECISION_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1)
#: Job run time buckets (seconds).
RUN_BUCKETS = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600)


@dataclass
class GateLook:
    """What a scrape reads of one gate, built under its lock (``Gate.look``)."""

    held: dict[tuple[str, int], int] = field(default_factory=dict)  # (type, tier): held
    running: dict[tuple[str, int], int] = field(default_factory=dict)  # (type, tier): fair runs
    blocked: dict[str, int] = field(default_factory=dict)  # reason: held jobs it holds back
    reserved: int = 0
    plain_running: int = 0
    slots: int = 0  # the pool's slots for fair jobs: its size less its plain runs
    lookahead: int = 0  # the reserve's depth: jobs admitted ahead of a free slot
    mode: str = "alone"
    # fairness key: seconds its oldest held job has waited since it was published
    heads: dict[str, float] = field(default_factory=dict)
    # fairness key: the slots its policy gives it of this worker's (core/allocation.py)
    allocation: dict[str, int] = field(default_factory=dict)
    # fairness key: its jobs admitted here and not yet ended
    running_by_key: dict[str, int] = field(default_factory=dict)
    # slots the allocation gives keys beyond their weighted share (allocation.redistributed)
    redistributed: float = 0.0
    # effective priority: pending jobs at it now
    levels: dict[int, int] = field(default_factory=dict)
    # two-level keys: each tenant with work here, its (running, pending, accumulated cost)
    tenants: dict[str, tuple[int, int, float]] = field(default_factory=dict)


MODES = ("alone", "shared", "hold", "local")
#: The label of the keys not named.
OTHER = "other"


def prometheus() -> Any:
    """The ``prometheus_client`` module; ``ConfigurationError`` if it is not installed."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigurationError(
            "fair_metrics_port is set but prometheus_client is not installed: "
            "pip install 'celery-fair[metrics]'"
        ) from None
    return prometheus_client


@dataclass(frozen=True)
class _Spec:
    """One metric this module counts itself: its name (without ``celery_fair_``), help,
    label names, and for a histogram its bucket bounds."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None


WAIT = _Spec("queue_wait_seconds", "Time from a fair job's receipt by this worker to its "
             "admission.", ("job_type", "tier"), WAIT_BUCKETS)  # fmt: skip
STARTED = _Spec("started", "Fair jobs handed to the pool.", ("job_type", "tier"))
RUNTIME = _Spec("job_duration_seconds", "Run time of fair jobs that ended with a known run "
                "time (what teaches the costs).", ("job_type",), RUN_BUCKETS)  # fmt: skip
RELEASED = _Spec("released", "Admitted fair jobs that ended without a known run time "
                 "(revoked, lost, given back before they started).", ("job_type",))  # fmt: skip
REFUSED = _Spec("refused", "Admissions the shared store refused, by what blocked them "
                "fleet-wide.", ("job_type", "reason"))  # fmt: skip
DECISION = _Spec("decision_duration_seconds", "Time the scheduling core takes for one "
                 "decision (admitting every job it can).", (), DECISION_BUCKETS)  # fmt: skip
CALLS = _Spec("store_call_duration_seconds", "Round trip of the worker's calls to the shared "
              "store, failed ones included.", ("kind",), CALL_BUCKETS)  # fmt: skip
ERRORS = _Spec("store_errors", "Store calls that failed.", ("kind",))
LEASE = _Spec("lease_losses", "Times the store was found to no longer count this worker's "
              "running jobs.")  # fmt: skip
OUTAGES = _Spec("store_outages", "Times the store became unreachable.")
RETURNED = _Spec("returned", "Held messages returned to the broker: to unblock its queue "
                 "(spill) or before its ack timeout (ack_timeout).", ("reason",))  # fmt: skip
DROPPED = _Spec("dropped", "Fair messages dropped unrun: a copy of a job held, running or "
                "done (duplicate), revoked or expired while held (revoked), bad headers sent "
                "to the dead letter queue (dead_letter).", ("reason",))  # fmt: skip
REPAIRED = _Spec("headers_repaired", "Fairness headers the gate repaired and ran the job "
                 "with: malformed ones, and those out of bounds (an undeclared fair_priority, "
                 "a fair_submitted before the horizon).", ("header",))  # fmt: skip
ALLOCATION = _Spec("allocation_changes", "Changes of a fairness key's slot allocation on "
                   "this worker (work came or went, a policy, a pause, the pool's size), "
                   "looked at about once a second.")  # fmt: skip
LOWERED = _Spec("priority_lowered", "Fair jobs asked above their fairness key's "
                "max_priority and given that bound instead.", ("job_type",))  # fmt: skip
GIVEN_BACK = _Spec("given_back", "Admitted jobs that had not started, given back to let a "
                   "newcomer go first, or because the worker's lease may have lapsed since "
                   "their admission.")  # fmt: skip
MOVED = _Spec("intake_moved", "Messages the intake moved from a queue into its fair shards.",
              ("queue",))  # fmt: skip
REROUTED = _Spec("lane_rerouted", "Stragglers the intake moved from a shard to their key's "
                 "lane (Redis): messages of a key that waited in its shard from before the key "
                 "got its lane.", ("queue",))  # fmt: skip
HEAD_WAIT = _Spec("key_head_wait_to_start_seconds", "Time a fair job waited at the head "
                  "of its fairness key's queue before this worker started it: from its "
                  "publish (time in the broker included), or from the previous start of its "
                  "key here if that came later. The first fair_metrics_top_keys keys started "
                  'here by name, every other as key="other".', ("key",),
                  WAIT_BUCKETS)  # fmt: skip
AGED = _Spec("aging_promotions", "Levels fair jobs had risen by aging when they were admitted "
             "(a job admitted at effective priority 5 of base 2 counts 3).",
             ("job_type",))  # fmt: skip
URGENT = _Spec("urgent_admissions", "Fair jobs admitted after aging to the urgent threshold "
               "(they pass their key's cap and go before all others).", ("job_type",))  # fmt: skip
CONTROLLED = _Spec("job_control", "Job control's requests this worker's gate answered "
                   "(fair cancel, fair reprioritize), by operation and answer; elsewhere: "
                   "it did not have the job.", ("operation", "answer"))  # fmt: skip
SPECS = (WAIT, STARTED, RUNTIME, RELEASED, REFUSED, DECISION, CALLS, ERRORS, LEASE, OUTAGES,
         RETURNED, DROPPED, REPAIRED, LOWERED, GIVEN_BACK, MOVED, REROUTED, HEAD_WAIT, AGED,
         URGENT, CONTROLLED, ALLOCATION)  # fmt: skip


class WorkerMetrics(Observer):
    """One worker's metrics, in ``registry`` (a fresh one by default).

    Events are counted in plain dicts and lists, without prometheus_client's per-sample locks
    (a histogram observation through it costs about 4 us, a ``labels()`` lookup 7 us; here an
    event costs well under one): the worker's loop thread is the only writer of each, the
    intake's thread of its own. A scrape turns them into metric families.

    Args:
        look: Called at each scrape for the gauges (``Gate.look``); ``None``: counters only.
        worker: The worker's node name, a label of ``celery_fair_worker_info``.
        top_keys: The fairness keys ``celery_fair_key_head_wait_seconds`` names.
    """

    def __init__(
        self,
        look: Callable[[], GateLook] | None = None,
        registry: CollectorRegistry | None = None,
        worker: str = "",
        top_keys: int = 10,
    ) -> None:
        p = prometheus()
        self.registry = registry if registry is not None else p.CollectorRegistry()
        # counts[spec]: labels -> value (counters); for histograms, labels -> [per-bucket
        # counts (the last: above every bound)..., sum].
        self.counts: dict[_Spec, dict[tuple[str, ...], Any]] = {spec: {} for spec in SPECS}
        self._wait, self._started = self.counts[WAIT], self.counts[STARTED]
        self._decisions = self.counts[DECISION]
        self.top_keys = top_keys
        self._key_labels: dict[str, str] = {}  # a key -> its label in HEAD_WAIT
        info = p.Info("worker", "This worker and celery-fair's version.",
                      namespace="celery_fair", registry=self.registry)  # fmt: skip
        info.info({"version": __version__, "worker": worker})
        self.registry.register(_EventCollector(self))
        if look is not None:
            self.registry.register(_GateCollector(look, top_keys))

    # -- counting ----------------------------------------------------------------------

    @staticmethod
    def _observe(rows: dict[tuple[str, ...], list[float]], spec: _Spec, labels: tuple[str, ...],
                 value: float) -> None:  # fmt: skip
        row = rows.get(labels)
        if row is None:
            assert spec.buckets is not None
            row = rows[labels] = [0] * (len(spec.buckets) + 2)
            row[-1] = 0.0
        row[bisect_left(spec.buckets, value)] += 1  # type: ignore[arg-type]
        row[-1] += value

    def _add(self, spec: _Spec, labels: tuple[str, ...], n: float = 1) -> None:
        rows = self.counts[spec]
        rows[labels] = rows.get(labels, 0) + n

    # -- events ------------------------------------------------------------------------

    def admitted(self, job_type: str, priority: int, wait: float) -> None:
        self._observe(self._wait, WAIT, (job_type, str(priority)), wait)

    def head_waited(self, fairness_key: str, seconds: float) -> None:
        # A key keeps the label it was first given, so every series only grows: the first
        # top_keys keys by name, then every other as "other" (its own series, never moved).
        label = self._key_labels.get(fairness_key)
        if label is None:
            named = len(self._key_labels) < self.top_keys and fairness_key != OTHER
            label = fairness_key if named else OTHER
            if named:
                self._key_labels[fairness_key] = label
        self._observe(self.counts[HEAD_WAIT], HEAD_WAIT, (label,), seconds)

    def promoted(self, job_type: str, levels: int, urgent: bool) -> None:
        if levels:
            self._add(AGED, (job_type,), levels)
        if urgent:
            self._add(URGENT, (job_type,))

    def started(self, job_type: str, priority: int) -> None:
        labels = (job_type, str(priority))
        rows = self._started
        rows[labels] = rows.get(labels, 0) + 1

    def finished(self, job_type: str, priority: int, elapsed: float | None) -> None:
        if elapsed is None:
            self._add(RELEASED, (job_type,))
        else:
            self._observe(self.counts[RUNTIME], RUNTIME, (job_type,), elapsed)

    def decided(self, seconds: float, admitted: int) -> None:
        self._observe(self._decisions, DECISION, (), seconds)

    def store_call(self, kind: str, seconds: float, ok: bool) -> None:
        self._observe(self.counts[CALLS], CALLS, (kind,), seconds)
        if not ok:
            self._add(ERRORS, (kind,))

    def blocked(self, job_type: str, priority: int, reason: str) -> None:
        self._add(REFUSED, (job_type, reason))

    def given_back(self, n: int) -> None:
        self._add(GIVEN_BACK, (), n)

    def lease_lost(self) -> None:
        self._add(LEASE, ())

    def outage(self, mode: str) -> None:
        self._add(OUTAGES, ())

    def spilled(self, n: int) -> None:
        self._add(RETURNED, ("spill",), n)

    def refreshed(self) -> None:
        self._add(RETURNED, ("ack_timeout",))

    def dead_lettered(self) -> None:
        self._add(DROPPED, ("dead_letter",))

    def repaired(self, header: str) -> None:
        self._add(REPAIRED, (header,))

    def priority_lowered(self, job_type: str) -> None:
        self._add(LOWERED, (job_type,))

    def allocation_changed(self, fairness_key: str, before: int, after: int) -> None:
        self._add(ALLOCATION, ())

    def revoked_held(self) -> None:
        self._add(DROPPED, ("revoked",))

    def duplicate(self) -> None:
        self._add(DROPPED, ("duplicate",))

    def dropped(self) -> None:
        self._add(DROPPED, ("duplicate",))

    def moved(self, queue: str, n: int) -> None:
        self._add(MOVED, (queue,), n)

    def rerouted(self, queue: str, n: int) -> None:
        self._add(REROUTED, (queue,), n)

    def controlled(self, operation: str, answer: str) -> None:
        self._add(CONTROLLED, (operation, answer))


class _EventCollector:
    """The counted events as Prometheus families, built at each scrape."""

    def __init__(self, metrics: WorkerMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

        for spec in SPECS:
            name = f"celery_fair_{spec.name}"
            rows = list(self.metrics.counts[spec].items())  # one C-level copy: no lock needed
            if spec.buckets is None:
                counter = CounterMetricFamily(name, spec.help, labels=list(spec.labels))
                for labels, n in sorted(rows):
                    counter.add_metric(list(labels), n)
                yield counter
                continue
            histogram = HistogramMetricFamily(name, spec.help, labels=list(spec.labels))
            bounds = [*(repr(float(b)) for b in spec.buckets), "+Inf"]
            for labels, row in sorted(rows):
                row = list(row)
                cumulative: list[tuple[str, float]] = []
                total = 0
                for bound, n in zip(bounds, row[:-1], strict=True):
                    total += n
                    cumulative.append((bound, total))
                histogram.add_metric(list(labels), cumulative, sum_value=row[-1])
            yield histogram


class _GateCollector:
    """The gauges, read from the gate at each scrape."""

    def __init__(self, look: Callable[[], GateLook], top_keys: int = 10) -> None:
        self.look = look
        self.top_keys = top_keys

    def describe(self) -> list[Any]:
        return []  # unchecked at registration: the gate may not be ready yet

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        look = self.look()
        held = GaugeMetricFamily(
            "celery_fair_held_jobs",
            "Fair jobs this worker holds unacknowledged, waiting for admission.",
            labels=["job_type", "tier"],
        )
        for (job_type, tier), n in sorted(look.held.items()):
            held.add_metric([job_type, str(tier)], n)
        yield held
        blocked = GaugeMetricFamily(
            "celery_fair_blocked_jobs",
            "Held jobs by what holds each back now (each counted once): paused, conflict, "
            "key_cap, type_cap, tier_cap, capacity (every slot busy), admissible (waiting for "
            "the next decision).",
            labels=["reason"],
        )
        for reason, n in sorted(look.blocked.items()):
            blocked.add_metric([reason], n)
        yield blocked
        running = GaugeMetricFamily(
            "celery_fair_running_jobs",
            "Fair jobs this worker runs (admitted and handed to the pool, or about to be).",
            labels=["job_type", "tier"],
        )
        for (job_type, tier), n in sorted(look.running.items()):
            running.add_metric([job_type, str(tier)], n)
        yield running
        yield GaugeMetricFamily(
            "celery_fair_reserved_jobs",
            "Admitted fair jobs waiting in the gate's reserve for a free pool process.",
            value=look.reserved,
        )
        yield GaugeMetricFamily(
            "celery_fair_plain_running_jobs",
            "Plain (not fair) tasks this worker runs; they take slots too.",
            value=look.plain_running,
        )
        yield GaugeMetricFamily(
            "celery_fair_capacity_slots",
            "The pool's slots for fair jobs: its size less the plain tasks it runs.",
            value=look.slots,
        )
        yield GaugeMetricFamily(
            "celery_fair_lookahead_jobs",
            "The reserve's depth: fair jobs admitted ahead of a free pool process at most.",
            value=look.lookahead,
        )
        mode = GaugeMetricFamily(
            "celery_fair_store_mode",
            "1 for the mode the worker decides in: alone (no store), shared, hold or local "
            "(the store unreachable).",
            labels=["mode"],
        )
        for name in MODES:
            mode.add_metric([name], 1.0 if name == look.mode else 0.0)
        yield mode
        heads = GaugeMetricFamily(
            "celery_fair_key_head_wait_seconds",
            "How long the oldest job this worker holds of each fairness key has waited since "
            "it was published, for the keys that have waited longest (fair_metrics_top_keys); "
            'the longest of the rest as key="other".',
            labels=["key"],
        )
        for key, wait in head_waits(look.heads, self.top_keys):
            heads.add_metric([key], wait)
        yield heads
        shares = GaugeMetricFamily(
            "celery_fair_key_allocation_slots",
            "The slots of this worker each fairness key with work would get by its policy "
            "(minimums, then weights, within caps and demand), for the fair_metrics_top_keys "
            'keys with the most; the rest summed as key="other".',
            labels=["key"],
        )
        named = top_allocations(look.allocation, self.top_keys)
        for key, slots in named:
            shares.add_metric([key], slots)
        yield shares
        used = GaugeMetricFamily(
            "celery_fair_key_allocation_utilization",
            "Of each fairness key's allocation on this worker, the part its running jobs use "
            "(running / allocated; above 1 while a key runs more than its share, as slots "
            "nobody else can use allow), for the keys key_allocation_slots names; "
            'key="other": the rest together.',
            labels=["key"],
        )
        by_key, shown = look.running_by_key, dict(named)
        for key, slots in named:
            if slots:
                if key == OTHER:
                    others = sum(n for k, n in by_key.items() if k not in shown)
                    used.add_metric([key], others / slots)
                else:
                    used.add_metric([key], by_key.get(key, 0) / slots)
        yield used
        yield GaugeMetricFamily(
            "celery_fair_allocation_redistributed_slots",
            "Slots this worker's allocation gives keys beyond their weighted share: what keys "
            "with too little work (or a cap) left to the others, and what minimums moved.",
            value=look.redistributed,
        )
        levels = GaugeMetricFamily(
            "celery_fair_pending_effective_priority_jobs",
            "Fair jobs this worker holds, not yet admitted, by their effective priority now "
            "(their own, as aging has raised it).",
            labels=["priority"],
        )
        for level, n in sorted(look.levels.items()):
            levels.add_metric([str(level)], n)
        yield levels
        if look.tenants:  # two-level keys (fair_key_separator)
            yield from _tenant_gauges(GaugeMetricFamily, look.tenants, self.top_keys)


def _tenant_gauges(
    family: Any, tenants: dict[str, tuple[int, int, float]], top: int
) -> Iterator[Any]:
    """The tenant level's gauges: running and held jobs and cost, for the ``top`` tenants
    with the most jobs here and the rest as ``other`` (``top_tenants``)."""
    named = top_tenants(tenants, top)
    gauges = (
        ("celery_fair_tenant_running_jobs", "Fair jobs this worker runs, by tenant"),
        ("celery_fair_tenant_held_jobs", "Fair jobs this worker holds, not yet admitted, by "
                                         "tenant"),
        ("celery_fair_tenant_accumulated_cost", "Each tenant's accumulated cost as this worker "
                                                "has it (the fleet's, with a store); other: "
                                                "the least of the rest"),
    )  # fmt: skip
    for i, (name, text) in enumerate(gauges):
        gauge = family(
            name,
            f"{text} (fair_key_separator): the fair_metrics_top_keys tenants with the most "
            'jobs here by name, the rest as tenant="other".',
            labels=["tenant"],
        )
        for tenant, values in named:
            gauge.add_metric([tenant], values[i])
        yield gauge


def top_tenants(
    tenants: dict[str, tuple[int, int, float]], top: int
) -> list[tuple[str, tuple[int, int, float]]]:
    """The ``top`` tenants with the most jobs (running and pending), then the rest as
    ``other``: their jobs summed, the least of their costs (a tenant named ``other`` among
    the top counts as the rest). O(tenants log tenants).

    >>> top_tenants({"a": (1, 0, 5.0), "b": (2, 7, 1.0), "c": (0, 1, 3.0)}, 1)
    [('b', (2, 7, 1.0)), ('other', (1, 1, 3.0))]
    """
    ranked = sorted(tenants.items(), key=lambda kv: (-(kv[1][0] + kv[1][1]), kv[0]))
    named = [(t, v) for t, v in ranked[:top] if t != OTHER]
    rest = [v for t, v in ranked if (t, v) not in named]
    if not rest:
        return named
    summed = (sum(v[0] for v in rest), sum(v[1] for v in rest), min(v[2] for v in rest))
    return [*named, (OTHER, summed)]


def top_allocations(slots: dict[str, int], top: int) -> list[tuple[str, int]]:
    """The ``top`` largest allocations by key, then the rest summed as ``other``.

    >>> top_allocations({"a": 1, "b": 9, "c": 4}, 1)
    [('b', 9), ('other', 5)]
    """
    ranked = sorted(slots.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [(k, n) for k, n in ranked[:top] if k != OTHER]
    rest = sum(n for k, n in ranked if (k, n) not in named)
    return named + ([(OTHER, rest)] if len(named) < len(ranked) else [])


def head_waits(heads: dict[str, float], top: int) -> list[tuple[str, float]]:
    """The ``top`` longest waits by key, then the longest of the rest as ``other`` (a key
    named ``other`` among the top counts as the rest). O(keys log keys).

    >>> head_waits({"a": 1.0, "b": 9.0, "c": 4.0}, 1)
    [('b', 9.0), ('other', 4.0)]
    """
    ranked = sorted(heads.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [(k, w) for k, w in ranked[:top] if k != OTHER]
    rest = [w for k, w in ranked[top:]] + [w for k, w in ranked[:top] if k == OTHER]
    return named + ([(OTHER, max(rest))] if rest else [])


def serve(metrics: WorkerMetrics, port: int, address: str = "0.0.0.0") -> tuple[Any, int]:
    """Serve ``metrics`` over HTTP at ``/metrics`` on a daemon thread. Returns the server
    (``shutdown()`` stops it) and the port it listens on (``port`` 0: one the OS chose)."""
    p = prometheus()
    server, _ = p.start_http_server(port, addr=address, registry=metrics.registry)
    return server, int(server.server_address[1])
