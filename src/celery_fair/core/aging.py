"""Priority aging without timers: the clock of a decision, pause logs and the promotion agenda.

A job's effective priority is a function of how long it has waited (``types.Aging``), so it is
computed when a decision looks and never stored. What has to be kept is only *when the order
changes*: a key queue's entry records the effective level of its head, which time raises, so
the entry would fall behind the truth. Each entry of an aging lane therefore books the time its
head next rises on the scheduler's ``Agenda``; every operation first runs the agenda up to its
``now`` and gives each key queue due a fresh entry. Within a key queue of one lane, jobs wait in
arrival order and age at the same pace, so the head is always the most aged: the agenda holds
at most one booking per key queue, never one per job, and a decision never rescans pending jobs.

Time paused does not count as waiting. A key and a type each keep a log of their pauses
(``PauseLog``); a job's wait is the time since its arrival minus the time its key *or* its type
was paused in between (the union, so a pause of both counts once). While either is paused its
jobs' levels stand still and nothing is booked; a resume books them again.
"""

from __future__ import annotations

from heapq import heappop, heappush
from itertools import count
from math import inf

__all__ = ["URGENT", "Agenda", "PauseLog", "paused_within"]

URGENT = inf
"""The level of an urgent job in the order: above every priority (``-URGENT`` sorts first)."""

_next_id = count(1).__next__


class PauseLog:
    """When one key or type was paused: closed ``[start, end]`` intervals and an open one.

    ``spans`` are the closed intervals, oldest first; ``since`` the start of the pause now in
    force, or ``None``.
    """

    __slots__ = ("since", "spans")

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self.since: float | None = None

    def pause(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def resume(self, now: float) -> None:
        since = self.since
        if since is not None:
            self.since = None
            if now > since:
                self.spans.append((since, now))

    def intervals(self, now: float) -> list[tuple[float, float]]:
        out = list(self.spans)
        if self.since is not None and now > self.since:
            out.append((self.since, now))
        return out


def paused_within(logs: tuple[PauseLog | None, ...], start: float, end: float) -> float:
    """Seconds of ``[start, end]`` during which any of ``logs`` was paused (their union)."""
    if end <= start:
        return 0.0
    spans = sorted(
        (max(a, start), min(b, end))
        for log in logs
        if log is not None
        for a, b in log.intervals(end)
        if b > start and a < end
    )
    total = 0.0
    cur_a = cur_b = None
    for a, b in spans:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a  # type: ignore[operator]
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    if cur_b is not None:
        total += cur_b - cur_a  # type: ignore[operator]
    return total


class Agenda:
    """The time of each decision, and when each aging key queue's head next rises.

    ``now`` is the time of the operation in progress (the scheduler sets it before anything
    else). ``heap`` holds ``(time, id, key_queue)``; a booking is live while its id is the key
    queue's ``due``. ``active`` says some lane ages at all.
    """

    __slots__ = ("active", "heap", "now")

    def __init__(self, now: float) -> None:
        self.now = now
        self.heap: list[tuple[float, int, object]] = []
        self.active = False

    def book(self, kq: object, at: float) -> None:
        """Book ``kq`` (a ``fairqueue.KeyQueue``) for ``at``, replacing its earlier booking."""
        kq.due = ident = _next_id()  # type: ignore[attr-defined]
        heappush(self.heap, (at, ident, kq))

    def due(self, now: float) -> list[object]:
        """Pop the live bookings due at ``now``: the key queues whose head has risen."""
        heap = self.heap
        out = []
        while heap and heap[0][0] <= now:
            _, ident, kq = heappop(heap)
            if kq.due == ident:  # type: ignore[attr-defined]
                kq.due = 0  # type: ignore[attr-defined]
                out.append(kq)
        return out

    def next_time(self) -> float | None:
        """When the next booking falls (it may have been replaced since), or ``None``."""
        heap = self.heap
        while heap and heap[0][2].due != heap[0][1]:  # type: ignore[attr-defined]
            heappop(heap)
        return heap[0][0] if heap else None
