"""Fairness fields in Celery's own task events, so that Flower shows them.

No new event type: a custom ``task-*`` event becomes a state of its own in Celery's event
state (Flower's), which then masks STARTED. The fields ride on the standard events instead:

- ``task-received``, sent by Celery's strategy before the gate sees the request, carries the
  message's ``fairness_key``, ``job_type``, ``job_id``, ``submitted`` (its ``fair_submitted``
  header: when it was published, epoch seconds on the producer's clock) and ``shard`` (the
  index of its key's shard among its queue's ``fair_shards``; none when sharding is off)
  for tasks whose class uses ``fair_strategy`` (every ``FairTask``, so every ``@fair_task``):
  a held task shows in Flower as RECEIVED with its key.
- Every later event of a fair job (``task-started`` when it is admitted and starts, then
  ``task-succeeded``, ``-failed``, ``-retried``, ``-revoked``...) carries the same fields as the
  gate parsed them (repaired where they were bad), plus ``queue_wait`` (seconds from its receipt
  to its admission), ``publish_wait`` (seconds from ``submitted`` to its admission: the time
  in the broker too, read across the producer's and the worker's clocks, never below 0),
  ``place_in_key`` (its key's jobs held by this worker when it arrived, itself
  included), ``held_at_receipt`` (all fair jobs it held then), ``fencing_token``, and from its
  admission on ``effective_priority`` (its priority as aging had raised it then; its own
  priority without aging), ``urgent`` (``True`` when it had aged to the urgent threshold;
  absent otherwise) and ``fair_priority`` (its own priority: its type's, or the one it was
  published or reprioritised with). The gate
  attaches them when it holds the request (``attach``), for every fair job, whatever its task.

Both only while the worker sends task events (``-E``, or ``celery control enable_events``, which
Flower sends), and cost nothing otherwise.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from celery.worker.strategy import default as _default_strategy

from ..core.tenants import tenant_name
from ..observe import Observer
from ..routing import shard_count, shard_of
from .headers import FAIRNESS_KEY, JOB_ID, JOB_TYPE, SUBMITTED, header_text

__all__ = [
    "EVENT_FIELDS",
    "attach",
    "fair_strategy",
    "on_admission",
    "on_receipt",
    "received_fields",
]

#: Every field celery-fair adds to task events; ``celery_fair.flower`` shows them.
EVENT_FIELDS = (
    "fairness_key",
    "tenant",
    "job_type",
    "job_id",
    "submitted",
    "shard",
    "queue_wait",
    "publish_wait",
    "place_in_key",
    "held_at_receipt",
    "fencing_token",
    "effective_priority",
    "urgent",
    "fair_priority",
)
#: The longest header value a ``task-received`` event repeats (the gate checks them later).
_LONGEST = 256


def received_fields(message: Any, shards: int, separator: str | None = None) -> dict[str, Any]:
    """The fields of a message's ``task-received`` event, from its raw headers: Unicode text
    only, none longer than 256 characters, and a finite submission time (the gate validates
    them when it holds the job); with a key ``separator``, the key's tenant."""
    headers = message.headers or {}
    fields: dict[str, Any] = {}
    for name in (FAIRNESS_KEY, JOB_TYPE, JOB_ID):
        value = header_text(headers.get(name))
        if value is not None and len(value) <= _LONGEST:
            fields[name] = value
    stamp = headers.get(SUBMITTED)
    if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
        fields["submitted"] = float(stamp)
    key = fields.get(FAIRNESS_KEY)
    if key is not None and shards > 1:
        fields["shard"] = shard_of(key, shards)
    if key is not None and separator is not None:
        fields["tenant"] = tenant_name(key, separator)
    return fields


class _Dispatcher:
    """The consumer's event dispatcher, adding the current message's fields to the
    ``task-received`` event the strategy sends."""

    def __init__(self, inner: Any, current: list[dict[str, Any] | None]) -> None:
        self._inner = inner
        self._current = current

    @property
    def enabled(self) -> bool:
        return bool(self._inner.enabled)

    def send(self, type: str, **fields: Any) -> Any:
        extra = self._current[0]
        if extra and type == "task-received":
            fields.update(extra)
        return self._inner.send(type, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __bool__(self) -> bool:
        return bool(self._inner)


class _ConsumerView:
    """The consumer as Celery's strategy sees it, with the dispatcher above."""

    def __init__(self, consumer: Any, dispatcher: _Dispatcher) -> None:
        self._consumer = consumer
        self.event_dispatcher = dispatcher

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)


def fair_strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
    """Celery's default strategy, whose ``task-received`` events carry the fairness fields.

    ``FairTask.Strategy`` names it. With no event dispatcher (``--without-heartbeat``-style
    consumers that never send events) it is Celery's own, unwrapped.
    """
    eventer = consumer.event_dispatcher
    if not eventer:
        return _default_strategy(task, app, consumer, **kwargs)  # type: ignore[no-any-return]
    current: list[dict[str, Any] | None] = [None]
    shards = shard_count(app.conf)
    separator = app.conf.get("fair_key_separator")  # validated by the worker's settings
    if not isinstance(separator, str):
        separator = None
    view = _ConsumerView(consumer, _Dispatcher(eventer, current))
    inner = _default_strategy(task, app, view, **kwargs)

    def task_message_handler(message: Any, *args: Any, **kw: Any) -> Any:
        if not eventer.enabled:
            return inner(message, *args, **kw)
        current[0] = received_fields(message, shards, separator)
        try:
            return inner(message, *args, **kw)
        finally:
            current[0] = None

    return task_message_handler


def attach(req: Any, fields: dict[str, Any]) -> None:
    """Make every event ``req`` sends from now on carry ``fields``, a dict the gate may still
    fill in (the wait and the token, at admission). Celery's ``Request.send_event`` is a plain
    method, so an instance attribute of that name takes its place for this request only."""
    send = type(req).send_event

    def send_event(type: str, **more: Any) -> None:
        send(req, type, **{**fields, **more})

    req.send_event = send_event


def on_receipt(
    parsed: Any, shard: int | None, place_in_key: int, held: int, tenant: str | None = None
) -> dict[str, Any]:
    """The fields a held job's task events carry from its receipt: its fairness headers (and
    its key's ``tenant`` with ``fair_key_separator``), its shard, its place among its key's
    pending jobs and how many the gate held with it, and its publish time if the producer gave
    one (for the wait from then)."""
    fields = {
        "fairness_key": parsed.fairness_key,
        "job_type": parsed.job_type,
        "job_id": parsed.job_id,
        "shard": shard,
        "place_in_key": place_in_key,
        "held_at_receipt": held,
    }
    if parsed.submitted is not None:
        fields["submitted"] = parsed.submitted
    if tenant is not None:
        fields["tenant"] = tenant
    return fields


class HeadWaits:
    """When this worker last started a job of each fairness key, to tell how long the next
    one waited at the head of its key's queue (``Observer.head_waited``). Keeps the
    ``size`` keys started most lately (a key forgotten counts from its jobs' publish, as a
    key met for the first time does). O(1) per start."""

    __slots__ = ("last", "size")

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self.last: OrderedDict[str, float] = OrderedDict()

    def started(self, fairness_key: str, arrival: float, now: float) -> float:
        """Seconds a job of ``fairness_key`` that arrived (was published) at ``arrival``
        waited at its key's head until its start ``now``; its start is the key's last."""
        last = self.last
        before = last.pop(fairness_key, None)
        last[fairness_key] = now
        if len(last) > self.size:
            last.popitem(last=False)
        head = arrival if before is None or before < arrival else before
        return max(0.0, now - head)


def report_admission(
    observer: Observer, fields: dict[str, Any] | None, admission: Any, wait: float, now: float
) -> None:
    """Count an admission after ``wait`` seconds held (and a promotion by aging or urgency),
    and add what it says to the job's event ``fields``, if it sends events (``on_admission``)."""
    observer.admitted(admission.type, admission.priority, wait)
    effective = admission.effective_priority
    if effective is not None and (effective != admission.priority or admission.urgent):
        observer.promoted(admission.type, effective - admission.priority, admission.urgent)
    if fields is not None:
        on_admission(fields, admission, wait, now)


def on_admission(fields: dict[str, Any], admission: Any, wait: float, now: float) -> None:
    """Add to a held job's event ``fields`` what its admission says: its wait in the gate
    (``wait`` seconds), its wait since publish (to ``now``, epoch seconds: on two clocks, the
    producer's and this one), its fencing token and priorities, and ``urgent`` only if it is
    (Flower shows every field that is set)."""
    fields["queue_wait"] = round(wait, 6)
    submitted = fields.get("submitted")
    if submitted is not None:
        fields["publish_wait"] = round(max(0.0, now - submitted), 6)
    fields["fencing_token"] = admission.token
    fields["fair_priority"] = admission.priority  # its own, reprioritised too
    if admission.effective_priority is not None:
        fields["effective_priority"] = admission.effective_priority
    if admission.urgent:
        fields["urgent"] = True
