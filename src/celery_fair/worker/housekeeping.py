"""The gate's periodic care of what it holds (its sweep): which messages to drop, refresh or
spill, decided here; the gate does what is decided.

- *Revoked and expired holds.* Celery's revoked set is looked at again only when it changed,
  or when a held message has an expiry (``RevokedWatch``).
- *Ack timeouts.* A message held longer than ``max_hold`` (by default ``HOLD_FRACTION`` of the
  broker's ack timeout: Redis ``visibility_timeout``, RabbitMQ ``consumer_timeout``) is
  returned to its queue before the broker redelivers it or closes the channel (``stale``).
- *Spill.* When the gate holds ``fair_max_held`` messages and a slot is free that none of them
  can take (``blocks_the_queue``), held work hides the messages behind it in the broker: the
  lowest-ranked tenth is returned (``spill_victims``), at most every ``fair_spill_interval``.

The rules are pure functions; ``Housekeeping`` applies them to one gate's held messages and
``RevokedWatch`` reads Celery's revoked set. No lock of its own: the gate calls it under its
lock.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

from celery.utils.log import get_logger

from ..core import BlockReason, Scheduler
from ..core.types import JobView
from ..engine import Engine
from ..observe import Observer
from .headers import PAUSED_SPILL
from .held import Held, HeldJobs
from .internals import revoked_marker

__all__ = [
    "HOLD_FRACTION",
    "RABBITMQ_CONSUMER_TIMEOUT",
    "REDIS_VISIBILITY_TIMEOUT",
    "Housekeeping",
    "Pace",
    "RevokedWatch",
    "blocks_the_queue",
    "default_max_hold",
    "spill_victims",
    "stale",
]

logger = get_logger(__name__)

#: Fraction of the broker's ack timeout a message may be held before it is republished.
HOLD_FRACTION = 0.5
#: Seconds the RabbitMQ server waits for an ack by default (``consumer_timeout``).
RABBITMQ_CONSUMER_TIMEOUT = 1800.0
#: Seconds the Redis transport waits for an ack by default (``visibility_timeout``).
REDIS_VISIBILITY_TIMEOUT = 3600.0


def default_max_hold(driver: str, transport_options: Mapping[str, Any] | None) -> float:
    """How long a message may be held on broker transport ``driver`` (``"redis"``,
    ``"amqp"``; any other: forever).

    >>> default_max_hold("redis", {"visibility_timeout": 100})
    50.0
    >>> default_max_hold("amqp", None)
    900.0
    """
    if driver == "redis":
        options = transport_options or {}
        timeout = float(options.get("visibility_timeout", REDIS_VISIBILITY_TIMEOUT))
    elif driver == "amqp":
        timeout = RABBITMQ_CONSUMER_TIMEOUT
    else:
        return float("inf")
    return timeout * HOLD_FRACTION


def stale(held: Iterable[Held], deadline: float) -> list[Held]:
    """The held messages received at or before ``deadline`` (monotonic); ``held`` in order of
    receipt, so this reads only those and the first after them."""
    out = []
    for h in held:
        if h.received > deadline:
            break
        out.append(h)
    return out


def blocks_the_queue(
    *, held: int, max_held: int, running: int, capacity: int, deciding: bool
) -> bool:
    """Held work blocks the queue: the window is full (``max_held``) and a slot is free that
    no held job can take (all wait for conflicts or caps), so the messages behind them in the
    broker, which might run now, cannot be seen. While every slot is busy nothing is blocked:
    held jobs start as fast as slots free, and the window moves with them. ``deciding``: a
    decision is due or the store is deciding, and may take the free slot at once.

    >>> blocks_the_queue(held=10, max_held=10, running=1, capacity=2, deciding=False)
    True
    >>> blocks_the_queue(held=10, max_held=10, running=2, capacity=2, deciding=False)
    False
    """
    return held >= max_held and running < capacity and not deciding


def spill_victims(
    pending: Sequence[JobView], paused_mark: Callable[[Hashable], int | None], version: int
) -> list[JobView]:
    """Which held jobs to return to the broker, lowest-ranked first: the lowest-ranked tenth
    (at least one) of ``pending`` (held jobs in dispatch order).

    A paused job goes back only if nothing else can, and once per pause: it carries the
    policies' ``version`` it was returned under (``paused_mark``), and is not returned again
    while that version holds (it would only come back, round and round)."""
    candidates = [v for v in pending if BlockReason.PAUSED not in v.blocked_by]
    if not candidates:
        candidates = [v for v in pending if paused_mark(v.uid) != version]
    if not candidates:
        return []
    return candidates[-max(1, len(candidates) // 10) :][::-1]


class Pace:
    """At most once per ``interval`` seconds.

    >>> pace = Pace(10.0)
    >>> pace.due(100.0), pace.due(105.0), pace.due(110.0)
    (True, False, True)
    """

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last = -float("inf")

    def due(self, now: float) -> bool:
        """Whether ``interval`` has passed since the last time this said yes (then counts
        from ``now``)."""
        if now - self._last < self.interval:
            return False
        self._last = now
        return True


class RevokedWatch:
    """Whether the held messages need a look for revoked or expired ones: Celery's revoked set
    changed since the last look, or one of them has an expiry."""

    def __init__(self) -> None:
        self._seen: Any = (-1, -1, -1)

    def due(self, held: Iterable[Held]) -> bool:
        marker = revoked_marker()
        if marker == self._seen and not any(h.req.expires for h in held):
            return False
        self._seen = marker
        return True


class Housekeeping:
    """The sweep's three duties over one gate's held messages (module docstring).

    ``give_back(held, reason, extra)`` returns a held message to the broker (``False``: it
    could not, and is still held); ``forget(uid)`` stops holding one that Celery dropped.
    """

    def __init__(
        self,
        held: HeldJobs,
        scheduler: Scheduler,
        engine: Engine,
        observer: Observer,
        *,
        max_hold: float,
        max_held: int,
        spill_interval: float,
        give_back: Callable[[Held, str, dict[str, Any] | None], bool],
        forget: Callable[[str], None],
    ) -> None:
        self._held = held
        self._scheduler = scheduler
        self._engine = engine
        self._observer = observer
        self.max_hold = max_hold
        self._max_held = max_held
        self._give_back = give_back
        self._forget = forget
        self._spills = Pace(spill_interval)
        self._revoked = RevokedWatch()

    def blocking(self, *, deciding: bool) -> bool:
        """Held work blocks the queue now (``blocks_the_queue``); ``deciding``: a decision is
        due or the store is deciding."""
        scheduler = self._scheduler
        return blocks_the_queue(
            held=len(self._held),
            max_held=self._max_held,
            running=scheduler.running,
            capacity=scheduler.capacity,
            deciding=deciding,
        )

    def drop_revoked(self) -> None:
        """Stop holding what Celery revoked or found expired (``req.revoked()`` does Celery's
        bookkeeping: ack, events, state). O(held) when the revoked set changed or a held
        message expires; else O(1)."""
        if not self._revoked.due(self._held.values()):
            return
        for uid, held in list(self._held.items()):
            if held.req.revoked():
                self._forget(uid)
                self._observer.revoked_held()
                logger.info(
                    "Held task %s[%s] was revoked or expired; dropped from the gate.",
                    held.req.name,
                    uid,
                )

    def refresh(self, now: float) -> None:
        """Return the messages held longer than ``max_hold`` at ``now`` (monotonic)."""
        for held in stale(self._held.values(), now - self.max_hold):
            if self._give_back(held, "held longer than the broker waits for an ack", None):
                self._observer.refreshed()

    def spill(self, now: float) -> None:
        """Held work blocks the queue: return the lowest-ranked tenth, unless the last spill
        was less than ``fair_spill_interval`` ago."""
        if not self._spills.due(now):
            return
        pending = [v for v in self._scheduler.snapshot().jobs if v.place is not None]
        version = self._engine.policy_version
        spilled = 0
        for view in spill_victims(pending, self._paused_mark, version):
            held = self._held.get(str(view.uid))
            paused = BlockReason.PAUSED in view.blocked_by
            extra = {PAUSED_SPILL: version} if paused else None
            if held is not None and self._give_back(held, "held work blocks the queue", extra):
                spilled += 1
        self._observer.spilled(spilled)
        logger.warning(
            "celery-fair holds %d messages (fair_max_held=%d) and none of them can take a free "
            "slot: returned the %d lowest-ranked to the broker.",
            len(self._held) + spilled,
            self._max_held,
            spilled,
        )

    def _paused_mark(self, uid: object) -> int | None:
        """The policies' version a held message was returned under while paused, if any."""
        held = self._held.get(str(uid))
        return None if held is None else held.headers.paused_spill
