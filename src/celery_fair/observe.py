"""What happens to fair jobs, told to one injected observer as it happens.

The engine, the gate and the intake each take an ``Observer`` and call it at every event that
someone watching the product wants to see: a job admitted (with its wait), started, finished,
released unstarted; the store refusing an admission (blocked, and why); a store call and how
long it took; a spill; a message moved by the intake; the store losing this worker's lease.
Everything that counts or measures these events is an observer of this one stream: the
counters ``celery inspect stats`` shows (``Counters``), the Prometheus metrics (metrics.py),
and whatever a user adds. ``Fanout`` hands each event to several.

The base class does nothing: a method is one attribute lookup and one call, so an event costs
well under a microsecond when nobody listens. Observers run on the thread that made the
event (the worker's event loop for the gate and the engine, the intake's thread for moves)
and must not block: they count, they do not do I/O.

Names of job types, tiers, reasons, queues and store calls are bounded sets (the registered
types, the configured tiers, ``BLOCK_REASONS``, the consumed queues, ``CALL_KINDS``); a
fairness key or a job id is never passed to an observer: it is unbounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .protocol import ControlAnswer
from .store.base import REFUSAL_REASONS

__all__ = [
    "BLOCK_REASONS",
    "CALL_KINDS",
    "CONTROL_ANSWERS",
    "CONTROL_OPERATIONS",
    "GATE_COUNTS",
    "STORE_COUNTS",
    "Counters",
    "Fanout",
    "Observer",
]

#: Why the store refused an admission: the fleet runs as many of the job's tier (``tier_cap``)
#: or type (``type_cap``) as the cap allows, another worker holds its conflict (``conflict``),
#: or the store came back empty and workers are re-registering (``recovering``).
BLOCK_REASONS = tuple(REFUSAL_REASONS.values())  # one spelling: store/base.py
#: Job control's operations on one gate, and its answers (control.py).
CONTROL_OPERATIONS = ("cancel", "reprioritize")
#: A gate's own answers (protocol.ControlAnswer), and ``elsewhere``: it does not have the job.
CONTROL_ANSWERS = (
    *(a.value for a in (ControlAnswer.CANCELLED, ControlAnswer.OK, ControlAnswer.ALREADY_RUNNING)),
    "elsewhere",
)
#: The store calls the engine makes.
CALL_KINDS = ("admit", "beat", "register")
#: The gate's counters, shown by ``inspect stats`` as ``fair-<name>``.
GATE_COUNTS = (
    "admitted",
    "spilled",
    "refreshed",
    "dead_lettered",
    "repaired",
    "priority_lowered",
    "allocation_changes",
    "revoked_held",
    "duplicates",
    "moved",
    "rerouted",
)
#: The engine's counters, shown by ``inspect stats`` as ``fair-store-<name>``.
STORE_COUNTS = (
    "calls",
    "failed",
    "refused",
    "stalled",
    "dropped",
    "registered",
    "released",
    "outages",
    "given_back",
    "leases_lost",
)


class Observer:
    """Receives every event; each method does nothing here. Subclass what you need."""

    # -- a job's life in the gate -------------------------------------------------------

    def admitted(self, job_type: str, priority: int, wait: float) -> None:
        """A held job was admitted after ``wait`` seconds from its receipt by this worker."""

    def promoted(self, job_type: str, levels: int, urgent: bool) -> None:
        """A job was admitted ``levels`` above its own priority, raised there by aging
        (``urgent``: it had reached the urgent threshold)."""

    def head_waited(self, fairness_key: str, seconds: float) -> None:
        """A job of ``fairness_key`` was handed to the pool ``seconds`` after it became the
        head of its key's queue here: after its publish, or after the previous start of its
        key by this worker if that came later (seed 004's "dequeue time for the tip of each
        queue"; the time in the broker counts, from the producer's ``fair_submitted``)."""

    def started(self, job_type: str, priority: int) -> None:
        """An admitted job was handed to the pool."""

    def allocation_changed(self, fairness_key: str, before: int, after: int) -> None:
        """The slots this worker's allocation gives ``fairness_key`` went from ``before`` to
        ``after`` (0: it had, or has, no work here): work came or went, a policy, a pause or
        the pool's size changed (seed 001's ``GroupAllocationChanged``; looked at once per
        sweep, about a second)."""

    def finished(self, job_type: str, priority: int, elapsed: float | None) -> None:
        """A job that was admitted ended: it ran ``elapsed`` seconds (``None``: it ended
        without teaching its cost: revoked, lost, given back before it started)."""

    def decided(self, seconds: float, admitted: int) -> None:
        """The core made a decision in ``seconds`` and admitted ``admitted`` jobs."""

    # -- the store ---------------------------------------------------------------------

    def store_call(self, kind: str, seconds: float, ok: bool) -> None:
        """A store call of ``kind`` (``CALL_KINDS``) came back after ``seconds``; ``ok`` is
        ``False`` when it failed (the store unreachable, or an error)."""

    def blocked(self, job_type: str, priority: int, reason: str) -> None:
        """The store refused to admit a job (``reason`` in ``BLOCK_REASONS``)."""

    def stalled(self) -> None:
        """A job's copy was found running on another worker: this one waits for it."""

    def dropped(self) -> None:
        """A job's copy had already run to the end elsewhere: dropped unrun."""

    def given_back(self, n: int) -> None:
        """``n`` admitted jobs that had not started were given back: for a newcomer, or
        because this worker's lease may have lapsed since their admission."""

    def registered(self, n: int) -> None:
        """The store had lost ``n`` jobs this worker runs: they were registered again."""

    def reconciled(self, n: int) -> None:
        """The store counted ``n`` jobs under this worker that ended: it released them."""

    def lease_lost(self) -> None:
        """The store no longer counts (all) this worker's running jobs: its lease expired, or
        the store came back empty. They are registered again with the next call."""

    def outage(self, mode: str) -> None:
        """The store became unreachable; the engine now runs in ``mode`` (hold or local)."""

    def recovered(self) -> None:
        """The store answers again."""

    # -- the gate's housekeeping and the intake ------------------------------------------

    def spilled(self, n: int) -> None:
        """``n`` held messages were returned to the broker because held work blocked it."""

    def refreshed(self) -> None:
        """A held message was returned to the broker before its ack timeout."""

    def dead_lettered(self) -> None:
        """A message with bad fairness headers went to the dead letter queue."""

    def repaired(self, header: str) -> None:
        """A message's ``header`` was bad or out of bounds and the gate repaired it (the
        default key, the type's priority, the horizon...); the job goes on (headers.py)."""

    def priority_lowered(self, job_type: str) -> None:
        """A job asked a priority above its fairness key's ``max_priority`` and was given
        that bound instead (its producer does not know the bound)."""

    def revoked_held(self) -> None:
        """A held job was revoked or expired and dropped from the gate."""

    def duplicate(self) -> None:
        """A second copy of a held or running job arrived and was dropped."""

    def moved(self, queue: str, n: int) -> None:
        """The intake moved ``n`` messages from ``queue`` into its shards."""

    def rerouted(self, queue: str, n: int) -> None:
        """The intake moved ``n`` stragglers from a shard of ``queue`` to their keys' lanes."""

    def controlled(self, operation: str, answer: str) -> None:
        """Job control asked this worker's gate for a job: ``operation`` (one of
        ``CONTROL_OPERATIONS``) and what it answered (``CONTROL_ANSWERS``; ``"elsewhere"``: it
        does not have the job)."""


class Fanout(Observer):
    """Hands each event to every observer in ``observers``, in order.

    Each event is bound once, here, to the observers that do something at it: an event none
    of them handles costs what it costs on the base class, one handled by one observer goes
    straight to it.
    """

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers
        for name in _EVENTS:
            targets = [getattr(o, name) for o in observers if _handles(o, name)]
            if len(targets) == 1:
                setattr(self, name, targets[0])
            elif targets:
                setattr(self, name, _fan(targets))
        self._handled = {name for name in _EVENTS if _handles_any(observers, name)}


class Counters(Observer):
    """Counts events: what ``inspect stats`` (and so Flower's worker page) shows.

    ``counts`` maps each name of ``GATE_COUNTS`` and ``STORE_COUNTS`` to its count.
    """

    def __init__(self) -> None:
        self.counts = dict.fromkeys((*GATE_COUNTS, *STORE_COUNTS), 0)

    def stats(self) -> dict[str, int]:
        """The counts under the names ``inspect stats`` shows."""
        counts = self.counts
        out = {f"fair-{n.replace('_', '-')}": counts[n] for n in GATE_COUNTS}
        out.update({f"fair-store-{n}": counts[n] for n in STORE_COUNTS})
        return out

    def admitted(self, job_type: str, priority: int, wait: float) -> None:
        self.counts["admitted"] += 1

    def store_call(self, kind: str, seconds: float, ok: bool) -> None:
        self.counts["calls"] += 1
        if not ok:
            self.counts["failed"] += 1

    def blocked(self, job_type: str, priority: int, reason: str) -> None:
        self.counts["refused"] += 1

    def stalled(self) -> None:
        self.counts["stalled"] += 1

    def dropped(self) -> None:
        self.counts["dropped"] += 1

    def given_back(self, n: int) -> None:
        self.counts["given_back"] += n

    def registered(self, n: int) -> None:
        self.counts["registered"] += n

    def reconciled(self, n: int) -> None:
        self.counts["released"] += n

    def lease_lost(self) -> None:
        self.counts["leases_lost"] += 1

    def outage(self, mode: str) -> None:
        self.counts["outages"] += 1

    def spilled(self, n: int) -> None:
        self.counts["spilled"] += n

    def refreshed(self) -> None:
        self.counts["refreshed"] += 1

    def dead_lettered(self) -> None:
        self.counts["dead_lettered"] += 1

    def repaired(self, header: str) -> None:
        self.counts["repaired"] += 1

    def priority_lowered(self, job_type: str) -> None:
        self.counts["priority_lowered"] += 1

    def allocation_changed(self, fairness_key: str, before: int, after: int) -> None:
        self.counts["allocation_changes"] += 1

    def revoked_held(self) -> None:
        self.counts["revoked_held"] += 1

    def duplicate(self) -> None:
        self.counts["duplicates"] += 1

    def moved(self, queue: str, n: int) -> None:
        self.counts["moved"] += n

    def rerouted(self, queue: str, n: int) -> None:
        self.counts["rerouted"] += n


_EVENTS = tuple(
    name for name, value in vars(Observer).items() if callable(value) and not name.startswith("_")
)


def _handles(observer: Observer, name: str) -> bool:
    """Whether ``observer`` does something at event ``name`` (the base class does nothing)."""
    if isinstance(observer, Fanout):
        return name in observer._handled
    return getattr(type(observer), name) is not getattr(Observer, name)


def _handles_any(observers: tuple[Observer, ...], name: str) -> bool:
    return any(_handles(o, name) for o in observers)


def _fan(targets: list[Callable[..., None]]) -> Callable[..., None]:
    def fan(*args: Any) -> None:
        for target in targets:
            target(*args)

    return fan
