"""The messages a gate holds: fair requests received and not yet handed to the pool.

A held message is unacknowledged: it stays the broker's until the gate starts its job (the
pool acks it as Celery would) or gives it back. ``HeldJobs`` keeps them by uid, oldest
receipt first, with the three indexes the gate keeps beside them:

- *aliases*: task id -> uid, for the held and running jobs whose uid is not their task id (a
  retry, a replacement), so that job control finds a job by the task id a user knows in O(1);
- *remembered priorities*: task id -> the priority job control gave a job this worker did not
  have (still in the broker, or held by another worker), taken if the job comes here; the last
  ``REMEMBERED`` of them;
- *shard counts*: held messages per queue they came from (a shard or a lane,
  ``shard_turns.slot_of``), which order the transport's reads (``ShardTurns``, Redis with
  shards) and tell which key crowds a shard (``core.lanes.Crowding``, with lanes).

Every operation is O(1) but the views that walk the held jobs (``by_tier``, ``by_type``).
It takes no lock of its own: the gate calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.lanes import Crowding
from .headers import FairHeaders
from .shard_turns import ShardTurns

__all__ = ["REMEMBERED", "Held", "HeldJobs"]

#: How many priorities given to jobs this worker does not have it remembers, for when they
#: arrive: as many task ids as Celery's revoked set keeps by default.
REMEMBERED = 50_000


@dataclass(slots=True)
class Held:
    """A fair request waiting for admission."""

    req: Any
    received: float  # monotonic
    headers: FairHeaders
    arrival: float  # the wall time its wait counts from (its publish, or its receipt)
    events: dict[str, Any] | None = None  # the fields its task events carry (events.py)
    shard: int = -1  # its slot in ShardTurns: its key's shard, or its lane (-1: not counted)
    priority: int | None = None  # its own priority, if not its type's


class HeldJobs(dict[str, Held]):
    """The held messages by uid, oldest receipt first (a dict, read as one: the gate reads
    it on every request), and their indexes (module docstring). Change it only through
    ``add`` and ``take``, which keep the indexes.

    >>> jobs = HeldJobs()
    >>> jobs.remember("t2", 9)
    >>> jobs.take_remembered("t2"), jobs.take_remembered("t2")
    ((True, 9), (False, None))
    """

    def __init__(self, turns: ShardTurns | None = None, crowding: Crowding | None = None) -> None:
        # self: uid -> Held, in order of receipt (a redelivered copy keeps its first place).
        super().__init__()
        # _aliases[task_id] == uid for every held or running job whose uid != task_id.
        self._aliases: dict[str, str] = {}
        # _priorities: task id -> priority for jobs not here, oldest first, at most REMEMBERED.
        self._priorities: dict[str, int | None] = {}
        # turns.held[s] and crowding.held[s] are the number of held jobs whose ``shard`` is s
        # (when there are turns, or lanes to ask for): with both, one list, the crowding's.
        if turns is not None and crowding is not None:
            turns.read(crowding.held)
            turns = None
        self.turns = turns
        self.crowding = crowding
        self.peak = 0  # the most held at once since the worker started

    def oldest(self) -> Held | None:
        """The job held longest (by receipt), or ``None``. O(1)."""
        return next(iter(self.values()), None)

    def add(self, uid: str, held: Held, shard: int | None = None) -> None:
        """Hold ``held`` as ``uid``; ``shard``: the slot of the queue it came from
        (``shard_turns.slot_of``), counted while there are shard turns or lanes. O(1)."""
        self[uid] = held
        task_id = held.req.id
        if uid != task_id:
            self._aliases[task_id] = uid
        if shard is not None and (self.turns is not None or self.crowding is not None):
            held.shard = shard
            if self.turns is not None:
                self.turns.add(shard)
            if self.crowding is not None:
                self.crowding.add(shard, held.headers.fairness_key)
        if len(self) > self.peak:
            self.peak = len(self)

    def receive(self, req: Any, parsed: FairHeaders, received: float, now: float) -> Held:
        """A new held job for ``req`` (not yet added): it waits from its publish (else from
        ``now``, wall time) at its headers' priority, unless job control gave it a priority
        while it was on its way, which restarts its wait. ``received``: monotonic. O(1)."""
        arrival = parsed.submitted if parsed.submitted is not None else now
        priority = parsed.priority
        given, remembered = self.take_remembered(req.id)
        if given:
            priority, arrival = remembered, now
        return Held(req, received, parsed, arrival, priority=priority)

    def take(self, uid: str, *, starts: bool = False) -> Held | None:
        """Stop holding ``uid`` (and counting it in its shard); ``starts``: it goes to the
        pool, so its alias stays (job control still finds it running). O(1)."""
        held = self.pop(uid, None)
        if held is not None:
            if held.shard >= 0:
                if self.turns is not None:
                    self.turns.remove(held.shard)
                if self.crowding is not None:
                    self.crowding.remove(held.shard, held.headers.fairness_key)
            if not starts:
                self.unalias(held.req.id, uid)
        return held

    def reslot(self, key: str, old: int, new: int) -> int:
        """Count the held messages of ``key`` in slot ``old`` in slot ``new`` instead (its
        stragglers, once the worker knows its lane); how many. O(held), once per key's lane."""
        moved = 0
        for held in self.values():
            if held.shard == old and held.headers.fairness_key == key:
                held.shard = new
                moved += 1
                if self.turns is not None:
                    self.turns.remove(old)
                    self.turns.add(new)
                if self.crowding is not None:
                    self.crowding.remove(old, key)
                    self.crowding.add(new, key)
        return moved

    def unalias(self, task_id: str, uid: str) -> None:
        """``uid`` (task id ``task_id``) is neither held nor running here any more."""
        if uid != task_id and self._aliases.get(task_id) == uid:
            del self._aliases[task_id]

    def uid_of(self, task_id: str) -> str:
        """The uid of this worker's job named ``task_id`` (held or running). O(1)."""
        return self._aliases.get(task_id, task_id)

    def remember(self, task_id: str, priority: int | None) -> None:
        """Keep ``priority`` for job ``task_id`` (not here) until it comes. O(1)."""
        remembered = self._priorities
        remembered.pop(task_id, None)
        remembered[task_id] = priority
        if len(remembered) > REMEMBERED:
            del remembered[next(iter(remembered))]

    def take_remembered(self, task_id: str) -> tuple[bool, int | None]:
        """``(True, priority)`` if a priority was remembered for ``task_id`` (now forgotten),
        else ``(False, None)``. O(1)."""
        if self._priorities and task_id in self._priorities:
            return True, self._priorities.pop(task_id)
        return False, None

    def by_tier(self, type_priority: Callable[[str], int]) -> dict[int, int]:
        """How many held jobs each priority tier has (a job's own priority, else its type's).
        O(held)."""
        tiers: dict[int, int] = {}
        for held in self.values():
            priority = held.priority
            if priority is None:
                priority = type_priority(held.headers.job_type)
            tiers[priority] = tiers.get(priority, 0) + 1
        return tiers

    def by_type(
        self, type_priority: Callable[[str], int]
    ) -> tuple[dict[tuple[str, int], int], dict[str, float]]:
        """How many held jobs each (type, type's priority) has, and each fairness key's oldest
        held arrival (wall time). O(held)."""
        counts: dict[tuple[str, int], int] = {}
        oldest: dict[str, float] = {}
        for held in self.values():
            name = held.headers.job_type
            tier = (name, type_priority(name))
            counts[tier] = counts.get(tier, 0) + 1
            key = held.headers.fairness_key
            if held.arrival < oldest.get(key, held.arrival + 1):
                oldest[key] = held.arrival
        return counts, oldest
