"""Fairness in Flower: load this module from Flower's configuration file.

    # flowerconfig.py
    from celery_fair.flower import *

    $ celery -A app flower --conf=flowerconfig.py

Flower has no plugin interface; it executes its configuration file in its own process before it
starts, which is where this module hooks in:

- **Task fields.** Fair workers put ``fairness_key``, ``tenant`` (with ``fair_key_separator``),
  ``job_type``, ``job_id``, ``submitted``,
  ``shard``, ``queue_wait``, ``publish_wait``, ``place_in_key``, ``held_at_receipt``,
  ``fencing_token``, ``effective_priority``, ``urgent`` and ``fair_priority`` in their task
  events (worker/events.py). Celery's event state keeps every field but lists only its own in
  ``Task._fields``, which Flower's task page, ``/api/tasks`` and ``/api/task/info`` show; the
  fair fields are added there.
- **Columns.** They become columns of the tasks page (``TASK_COLUMNS``), and the star import
  sets Flower's ``tasks_columns`` option to show the key, the type, the job id and the waits
  (``--tasks_columns`` on the command line still wins), and its ``format_task`` option so that
  the waits read as Flower's run times do (``format_task``).
- **Metrics.** Flower's ``/metrics`` serves Prometheus' default registry; a collector there reads
  the fleet's shared store at each scrape: live workers, running jobs by tier and type against
  their caps, by fairness key (the top ``TOP_KEYS`` and ``other``) and by tenant with
  ``fair_key_separator`` (the same), conflicts held, accumulated
  cost and service lag per top key, Jain's fairness index, and the submits a limit refused
  (``QueueFull``, counted by the producers' registry in the store). One exporter for the fleet:
  nothing is counted per worker here (workers serve their own metrics, metrics.py).

Each hook is applied on its own; one whose names moved in another Flower or Celery version is
logged once and skipped, and Flower keeps working. Tested against ``SUPPORTED_FLOWER``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeGuard

from .fleet import service
from .worker.events import EVENT_FIELDS

__all__ = ["format_task", "tasks_columns"]

logger = logging.getLogger(__name__)

#: The Flower versions the hooks are tested against (tests/e2e/test_flower.py runs in CI).
SUPPORTED_FLOWER = (">=2.0", "<2.3")
#: Fairness keys named in the fleet metrics; the rest are summed under ``other``.
TOP_KEYS = 10

#: Column labels of the tasks page.
COLUMNS = {
    "fairness_key": "Fairness key",
    "tenant": "Tenant",
    "job_type": "Job type",
    "job_id": "Job id",
    "submitted": "Published",
    "shard": "Shard",
    "queue_wait": "Wait since receipt",
    "publish_wait": "Wait since publish",
    "place_in_key": "Place in key",
    "held_at_receipt": "Held at receipt",
    "fencing_token": "Fencing token",
    "effective_priority": "Effective priority",
    "urgent": "Urgent",
    "fair_priority": "Priority",
}

#: Flower's ``tasks_columns`` option, set by ``from celery_fair.flower import *``.
tasks_columns = (
    "name,uuid,state,fairness_key,job_type,job_id,publish_wait,queue_wait,received,started,"
    "runtime,worker"
)

INSTALLED: dict[str, bool] = {}

#: The fields that are durations in seconds: shown as Flower shows a run time.
_DURATIONS = ("queue_wait", "publish_wait")


def format_task(task: Any) -> Any:
    """Flower's ``format_task`` option, set by ``from celery_fair.flower import *``: on the
    tasks page and each task's page (not in the API, which keeps numbers), the waits read as
    Flower's run times do (``850.00 ms``, ``3.20 s``, ``1:02:05``) and ``submitted`` as a date
    and time of the Flower server's zone. Flower hands it a copy of the task.

    An app with a ``format_task`` of its own calls this one from it::

        from celery_fair.flower import *
        from celery_fair.flower import format_task as fair_format_task

        def format_task(task):
            return my_format(fair_format_task(task))
    """
    for name in _DURATIONS:
        value = getattr(task, name, None)
        if _is_number(value):
            setattr(task, name, duration_words(value))
    submitted = getattr(task, "submitted", None)
    if _is_number(submitted):
        stamp = time.localtime(submitted)
        millis = round((submitted % 1) * 1000) % 1000
        task.submitted = time.strftime("%Y-%m-%d %H:%M:%S", stamp) + f".{millis:03d}"
    return task


def duration_words(seconds: float) -> str:
    """``seconds`` as Flower's tasks page writes a run time.

    >>> duration_words(0.0123), duration_words(3.2), duration_words(3725)
    ('12.30 ms', '3.20 s', '1:02:05')
    """
    if seconds < 1:
        return f"{seconds * 1000:.2f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def install() -> dict[str, bool]:
    """Apply every hook (idempotent); returns which took. Importing this module calls it."""
    for name, hook in (
        ("task_fields", _task_fields),
        ("columns", _columns),
        ("metrics", _metrics),
    ):
        if INSTALLED.get(name):
            continue
        try:
            hook()
        except Exception as exc:  # a renamed internal: Flower works on without this hook
            logger.warning(
                "celery-fair: could not add %s to Flower (%s: %s); Flower works without them. "
                "Supported Flower versions: %s.",
                name.replace("_", " "),
                type(exc).__name__,
                exc,
                ", ".join(SUPPORTED_FLOWER),
            )
            INSTALLED[name] = False
        else:
            INSTALLED[name] = True
    return dict(INSTALLED)


def _task_fields() -> None:
    from celery.events.state import Task

    missing = tuple(f for f in EVENT_FIELDS if f not in Task._fields)
    if not isinstance(Task._fields, tuple):
        raise TypeError(f"celery.events.state.Task._fields is a {type(Task._fields).__name__}")
    Task._fields = (*Task._fields, *missing)
    for name in missing:
        if not hasattr(Task, name):
            setattr(Task, name, None)  # a task from a plain worker has none of them


def _columns() -> None:
    from flower.views import tasks

    columns = tasks.TASK_COLUMNS
    if not isinstance(columns, dict):
        raise TypeError(f"flower.views.tasks.TASK_COLUMNS is a {type(columns).__name__}")
    columns.update(COLUMNS)


def _metrics() -> None:
    from prometheus_client import REGISTRY

    REGISTRY.register(FleetCollector(_flowers_app()))


def _flowers_app() -> Any:
    """The app of ``celery -A app flower``: Flower executes its configuration file inside its
    click command, whose context holds the app. ``None`` elsewhere (then the current app)."""
    import click

    ctx = click.get_current_context(silent=True)
    obj = getattr(ctx.find_root(), "obj", None) if ctx is not None else None
    return getattr(obj, "app", None)


class FleetCollector:
    """The fleet's fairness, read from its shared store at each scrape of Flower's /metrics."""

    def __init__(self, app: Any = None) -> None:
        self._app = app
        self._store: Any = None
        self._opened = False
        self._failing = False
        self._caps: tuple[dict[int, int | None], dict[str, int | None]] = ({}, {})

    def describe(self) -> list[Any]:
        return []  # not checked at registration: the store may not be reachable yet

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        store = self._open()
        up = GaugeMetricFamily(
            "celery_fair_fleet_store_up",
            "1 when Flower could read the fleet's shared store at this scrape.",
        )
        if store is None:
            up.add_metric([], 0.0)
            yield up
            return
        try:
            state = store.inspect()
        except Exception as exc:
            if not self._failing:
                logger.warning("celery-fair: cannot read the shared store (%s).", exc)
            self._failing = True
            up.add_metric([], 0.0)
            yield up
            return
        self._failing = False
        up.add_metric([], 1.0)
        yield up
        yield from fleet_metrics(state, *self._caps, tiers=self._tiers)

    def _open(self) -> Any:
        if self._opened:
            return self._store
        from celery import current_app

        from .connect import declared_types, open_store
        from .settings import FairSettings

        app = self._app or current_app
        settings = FairSettings.from_celery_conf(app.conf)
        types = declared_types(app, dict(settings.types))
        self._caps = (
            dict(settings.tier_caps),
            {name: t.max_concurrency for name, t in types.items()},
        )
        self._tiers = sorted({t.priority for t in types.values()})
        self._store = open_store(settings, app)
        self._opened = True
        if self._store is None:
            logger.warning(
                "celery-fair: this app has no shared store (fair_store_url, or a Redis broker): "
                "Flower's /metrics shows no fleet-wide fairness."
            )
        return self._store


def fleet_metrics(
    state: dict[str, Any],
    tier_caps: dict[int, int | None],
    type_caps: dict[str, int | None],
    top: int | None = None,
    tiers: Iterable[int] = (),
) -> Iterator[Any]:
    """The fleet metrics of one ``RedisStore.inspect()`` document. Pure: no I/O.

    ``tier_caps`` is ``fair_tier_caps`` (the overrides); each tier running, declared by a type
    (``tiers``) or overridden gets its cap in force, the priority value unless overridden.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    from .core import tier_cap as cap_in_force

    top = TOP_KEYS if top is None else top
    workers = GaugeMetricFamily(
        "celery_fair_fleet_workers", "Workers with a live lease in the shared store."
    )
    workers.add_metric([], len(state["workers"]))
    yield workers
    by_tier = GaugeMetricFamily(
        "celery_fair_fleet_running_jobs_by_tier",
        "Fair jobs running in the fleet, by priority tier.",
        labels=["tier"],
    )
    for tier, n in sorted(state["tiers"].items(), key=lambda kv: int(kv[0])):
        by_tier.add_metric([str(tier)], float(n))
    yield by_tier
    tier_cap = GaugeMetricFamily(
        "celery_fair_fleet_tier_cap",
        "Each tier's cap in force: its priority value unless fair_tier_caps overrides it "
        "(no sample: uncapped).",
        labels=["tier"],
    )
    for tier in sorted({*map(int, state["tiers"]), *tiers, *tier_caps}):
        cap = cap_in_force(tier_caps, tier)
        if cap is not None:
            tier_cap.add_metric([str(tier)], float(cap))
    yield tier_cap
    by_type = GaugeMetricFamily(
        "celery_fair_fleet_running_jobs_by_type",
        "Fair jobs running in the fleet, by job type.",
        labels=["job_type"],
    )
    for name, n in sorted(state["types"].items()):
        by_type.add_metric([name], float(n))
    yield by_type
    type_cap = GaugeMetricFamily(
        "celery_fair_fleet_type_cap",
        "Each job type's max_concurrency, fleet-wide.",
        labels=["job_type"],
    )
    for name, cap in sorted(type_caps.items()):
        if cap is not None:
            type_cap.add_metric([name], float(cap))
    yield type_cap
    conflicts = GaugeMetricFamily(
        "celery_fair_fleet_conflicts_held", "Conflicts (group, job_id) held by running jobs."
    )
    conflicts.add_metric([], len(state["conflicts"]))
    yield conflicts
    # Per fairness key: only the top keys by running jobs are named (labels stay bounded).
    keys = service(state, top)
    by_key = GaugeMetricFamily(
        "celery_fair_fleet_running_jobs_by_key",
        f"Fair jobs running in the fleet, for the {top} keys that run the most; the rest "
        'summed under fairness_key="other".',
        labels=["fairness_key"],
    )
    for k in keys.top:
        by_key.add_metric([_label(k.key)], float(k.running))
    if keys.other_keys:
        by_key.add_metric(["other"], float(keys.other_running))
    yield by_key
    # The top keys' service, one gauge per field of KeyService.
    for name, field, doc in (
        ("celery_fair_fleet_accumulated_cost", "cost",
         "Accumulated cost (learned seconds of work charged) of the top keys."),
        ("celery_fair_fleet_service_lag_seconds", "lag",
         "Mean accumulated cost of the running keys minus this key's: positive means the key "
         "has received less than its fair share so far."),
        ("celery_fair_fleet_service_share", "share",
         "This key's part of the accumulated cost of the keys that run now (0 to 1): 1/n each "
         "when all received the same service."),
    ):  # fmt: skip
        family = GaugeMetricFamily(name, doc, labels=["fairness_key"])
        for k in keys.top:
            family.add_metric([_label(k.key)], getattr(k, field))
        yield family
    tenants = state.get("tenants") or {}
    if tenants:  # two-level keys (fair_key_separator): the top tenants by running jobs
        ranked = sorted(tenants.items(), key=lambda kv: (-kv[1]["running"], kv[0]))
        named = [(t, v) for t, v in ranked[:top] if t != "other"]
        rest = [v for t, v in ranked if (t, v) not in named]
        running = GaugeMetricFamily(
            "celery_fair_fleet_running_jobs_by_tenant",
            f"Fair jobs running in the fleet, for the {top} tenants that run the most "
            '(fair_key_separator); the rest summed under tenant="other".',
            labels=["tenant"],
        )
        cost = GaugeMetricFamily(
            "celery_fair_fleet_tenant_accumulated_cost",
            "Accumulated cost of the tenants running_jobs_by_tenant names; other: the least "
            "of the rest.",
            labels=["tenant"],
        )
        for tenant, v in named:
            running.add_metric([_label(tenant)], float(v["running"]))
            cost.add_metric([_label(tenant)], float(v["cost"]))
        if rest:
            running.add_metric(["other"], float(sum(v["running"] for v in rest)))
            cost.add_metric(["other"], float(min(v["cost"] for v in rest)))
        yield running
        yield cost
    jain = GaugeMetricFamily(
        "celery_fair_fleet_jain_index",
        "Jain's fairness index of the accumulated costs of the keys that run now: 1 when all "
        "received the same service, 1/n when one received it all.",
    )
    jain.add_metric([], keys.jain_index)
    yield jain
    refused = CounterMetricFamily(
        "celery_fair_fleet_queue_full",
        "Submits a limit refused before anything was published (QueueFull), fleet-wide since "
        "the store began: scope key (fair_max_queued_per_key) or total (fair_max_queued).",
        labels=["scope"],
    )
    for scope in ("key", "total"):
        refused.add_metric([scope], float(state.get("queue_full", {}).get(scope, 0)))
    yield refused
    lanes = state.get("lanes") or {"size": 0, "keys": {}}
    agreed = GaugeMetricFamily(
        "celery_fair_fleet_lanes",
        "Lanes per queue the fleet agrees on (fair_lanes; 0 while a live worker consumes none).",
    )
    agreed.add_metric([], float(lanes["size"]))
    yield agreed
    in_use = GaugeMetricFamily(
        "celery_fair_fleet_lanes_in_use", "Lanes that have at least one key now."
    )
    in_use.add_metric([], float(len(set(lanes["keys"].values()))))
    yield in_use
    laned = GaugeMetricFamily(
        "celery_fair_fleet_keys_in_lanes",
        "Fairness keys that have a lane now (heavy keys); more than lanes in use: some share.",
    )
    laned.add_metric([], float(len(lanes["keys"])))
    yield laned


def _label(key: str) -> str:
    """A key as a label value: ``""`` (the background key) shows as ``(background)``."""
    from .core import key_label

    return key_label(key)


install()
