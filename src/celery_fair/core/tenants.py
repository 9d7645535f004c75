"""Two-level keys: a lane's pending jobs served fairly among tenants, then among a tenant's keys.

With a key separator (``SchedulerConfig.key_separator``), key ``acme/alice`` belongs to tenant
``acme`` (``tenant_name``), and the order is ``Lane.order``: the tenant's rank and accumulated
cost come before the key's (``jobs.widen``). A flat heap of key queues by that order would go
stale for every key of a tenant at each of the tenant's admissions (a tenant of 10,000 keys:
10,000 entries to push again before the next decision). So a lane's queue is two heaps deep:

- ``TenantedQueue`` is a heap of *tenant queues*, one per tenant with jobs in the lane, each
  entry recording the widened place, arrival and seq of that tenant's best job;
- a tenant queue is a ``fairqueue.KeyedQueue`` of the tenant's key queues, exactly as a lane's
  queue is without a separator (its ``parent`` is the ``TenantedQueue``).

Both levels are lazy in the same way: an entry is never later than the truth, costs only grow
between resets, and whatever moves a queue earlier pushes a fresh entry at once. A tenant
queue's entries follow its own: each entry its key queues get (``KeyedQueue.enter``, ``push``)
is offered to the tenant level (``TenantedQueue.lift``), which pushes a fresh tenant entry if
that one comes earlier. A charge makes one entry stale per lane at each level.

A tenant at its cap (``max_concurrency`` over all its keys) leaves the lanes' heaps as a whole,
as a key at its cap does (``block``), and comes back when it is below it (``unblock``). A
tenant whose cost or rank went down has fresh entries pushed for each of its tenant queues
(``reposition``). A free conflict's first waiter is offered to a tenanted lane as to a flat one
(``fairqueue.best_waiter``), at its widened place.
"""

from __future__ import annotations

from heapq import heappop, heappush, heapreplace
from typing import TYPE_CHECKING, Any

from .aging import URGENT
from .fairqueue import KeyedQueue, _next_id, or_waiter, resume_aging
from .fairqueue import reposition as _reposition_key
from .fairqueue import unblock as _unblock_key
from .jobs import widen

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .costs import KeyState
    from .fairqueue import ConflictLane, KeyQueue
    from .jobs import Conflict, ConflictKey, Job, Lane, Place

__all__ = ["TenantedQueue", "reposition", "resume", "tenant_name", "unblock"]

_NEG_URGENT = -URGENT


def tenant_name(key: str, separator: str) -> str:
    """Key ``key``'s tenant: the text before the first ``separator``, or ``key`` itself."""
    head, sep, _ = key.partition(separator)
    return head if sep else key


class TenantedQueue:
    """A lane's pending jobs with two-level keys, best first by ``Lane.order``.

    ``heap`` holds entries ``(*widened place, arrival, seq, id, tenant_queue)``; an entry is
    current when its id equals the tenant queue's ``tver``, and a current entry is never later
    than the true order of the tenant queue's best job. ``queues`` maps each tenant with jobs
    here to its tenant queue (also listed in the tenant's ``KeyState.queues``); ``size`` counts
    live jobs of all of them. ``conflicts``, ``lane``, ``cl`` and ``waiters`` as for
    ``KeyedQueue``.
    """

    __slots__ = ("cl", "conflicts", "heap", "lane", "queues", "size", "waiters")

    def __init__(
        self,
        lane: Lane,
        conflicts: dict[ConflictKey, Conflict] | None = None,
        cl: ConflictLane | None = None,
    ) -> None:
        self.heap: list[tuple[Any, ...]] = []
        self.queues: dict[KeyState, KeyedQueue] = {}
        self.size = 0
        self.conflicts: dict[ConflictKey, Conflict] = {} if conflicts is None else conflicts
        self.lane = lane
        self.cl = cl
        self.waiters: list[tuple[Any, ...]] = []

    def push(self, job: Job) -> None:
        """Add ``job`` to its tenant's queue; O(log n)."""
        tenant = job.key.tenant
        assert tenant is not None
        tq = self.queues.get(tenant)
        if tq is None:
            tq = self.queues[tenant] = KeyedQueue(self.lane, self.conflicts, self.cl)
            tq.parent = self
            tq.tenant = tenant
            if tenant.queues is None:
                tenant.queues = [tq]
            else:
                tenant.queues.append(tq)
        tq.push(job)

    def lift(self, tq: KeyedQueue, place: Place, job: Job) -> None:
        """``tq`` just gave its key queue, whose head is ``job``, an entry at ``place``: give
        ``tq`` an entry here no later than that, unless its tenant blocks ``job``. O(log n)."""
        tenant = tq.tenant
        assert tenant is not None
        if tq.tblocked and (place[0] != _NEG_URGENT or tenant.halted):
            return
        rec = (*widen(place, tenant.rank, tenant.acc, self.lane.by_key), job.arrival, job.seq)
        if tq.tver >= 0 and rec >= tq.trec:
            return
        tq.tver = ver = _next_id()
        tq.trec = rec
        heappush(self.heap, (*rec, ver, tq))

    def best(self, park: bool) -> Job | None:
        """The first job in order, fixing stale entries on the way; amortised O(log n) at each
        level. With ``park``, heads whose conflict is held are parked on the way."""
        heap = self.heap
        lane = self.lane
        by_key = lane.by_key
        while heap:
            entry = heap[0]
            tq: KeyedQueue = entry[-1]
            if entry[-2] != tq.tver:
                heappop(heap)
                continue
            job = tq.best(park)
            if job is None:
                heappop(heap)
                tq.tver = -1
                if not tq.queues:
                    self.drop(tq)
                continue
            tenant = tq.tenant
            assert tenant is not None
            place = lane.place(job)
            if tenant.running >= tenant.cap and (place[0] != _NEG_URGENT or tenant.halted):
                heappop(heap)  # the tenant is blocked: its queue leaves the heap
                tq.tver = -1
                if not tq.tblocked:
                    block(tq)
                continue
            rec = (*widen(place, tenant.rank, tenant.acc, by_key), job.arrival, job.seq)
            if rec == entry[:-2]:
                if self.waiters:  # a free conflict's first waiter may come first
                    return or_waiter(self, job, entry)
                return job
            tq.tver = ver = _next_id()
            tq.trec = rec
            heapreplace(heap, (*rec, ver, tq))
        return or_waiter(self, None, None) if self.waiters else None

    def refresh(self) -> None:
        """Rebuild both levels from the true positions (costs went down). O(keys)."""
        self.heap = []
        for tq in list(self.queues.values()):
            tq.tver = -1
            tq.refresh()  # each entry it makes is lifted here

    def drop(self, tq: KeyedQueue) -> None:
        """Forget the tenant queue ``tq``, which holds no key queue any more. O(queues of its
        tenant)."""
        tenant = tq.tenant
        assert tenant is not None
        tq.tver = -1
        if self.queues.get(tenant) is not tq:
            return
        del self.queues[tenant]
        queues = tenant.queues
        if queues is not None:
            queues.remove(tq)
            if not queues:
                tenant.queues = None
        if tq.tblocked:
            tq.tblocked = False
            blocked = tenant.blocked
            assert blocked is not None
            blocked.remove(tq)
            if not blocked:
                tenant.blocked = None

    def queue_of(self, key: KeyState) -> KeyQueue | None:
        """``key``'s key queue here (in its tenant's queue), if it has one. O(1)."""
        tq = self.queues.get(key.tenant)  # type: ignore[arg-type]
        return None if tq is None else tq.queues.get(key)

    def jobs(self) -> Iterator[Job]:
        """Every live job, in no particular order. O(n)."""
        for tq in self.queues.values():
            yield from tq.jobs()


def block(tq: KeyedQueue) -> None:
    """``tq``'s tenant is blocked: keep ``tq`` out of its heap (its entry was just dropped)."""
    tq.tblocked = True
    tenant = tq.tenant
    assert tenant is not None
    if tenant.blocked is None:
        tenant.blocked = [tq]
    else:
        tenant.blocked.append(tq)


def _lift_best(tq: KeyedQueue) -> None:
    """Give ``tq`` a fresh entry at the true place of its best job (older ones die by their
    id), unless its tenant blocks it, and lift its conflict lane, if any. O(log n)
    amortised."""
    tq.tver = -1
    job = tq.best(False)
    if job is None:
        return
    tq.parent.lift(tq, tq.lane.place(job), job)
    if tq.cl is not None:
        tq.cl.lift(job)


def reposition(key: KeyState) -> None:
    """``key``'s (or tenant's) accumulated cost or rank went down: move its queues back to
    their true places (``fairqueue.reposition`` for a key; for a tenant, a fresh entry for each
    of its tenant queues). O(q log n) for its q queues."""
    if not key.is_tenant:
        _reposition_key(key)
        return
    for tq in list(key.queues or ()):
        if not tq.tblocked:
            _lift_best(tq)


def unblock(key: KeyState) -> None:
    """``key`` (or tenant) is below its cap again: put its blocked queues back, each with a
    fresh entry. O(q log n), q its blocked queues."""
    if not key.is_tenant:
        _unblock_key(key)
        return
    queues = key.blocked
    if queues is None:
        return
    key.blocked = None
    for tq in queues:
        tq.tblocked = False
        _lift_best(tq)


def resume(key: KeyState) -> None:
    """``key`` (or tenant) is no longer halted (resumed, or refilled to a start of its rate)
    but may still be at its cap: its urgent heads pass the cap again. For a key, its queues
    get fresh entries and bookings (``fairqueue.resume_aging``); for a tenant, each blocked
    tenant queue whose best job is urgent gets its entry back. O(q log n)."""
    if not key.is_tenant:
        resume_aging(key)
        return
    for tq in list(key.blocked or ()):
        _lift_best(tq)
