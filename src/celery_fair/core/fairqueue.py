"""The pending index: fair order within a lane, conflict parking and lending.

A *lane* holds the pending jobs of one job type. Inside a lane the order is
``(accumulated_cost[key], arrival, seq)``; since every job of one fairness key shares the first
component, a lane is a heap of *key queues* (one per fairness key, each a heap of its jobs by
``(arrival, seq)``), and the lane's best job is the head of its best key queue.

Accumulated costs only grow between resets, so the lane heap is *lazy*: an entry records the
key's cost and head at the time it was pushed, which is never more than the truth. When the
top entry turns out stale it is pushed again with the true values. Anything that makes a key
queue's true position *earlier* (a new head, a lower cost) pushes a fresh entry at once; older
entries of that queue are recognised by their id and skipped.

A job whose conflict (group, job_id) is held is *parked* the first time it reaches the head of
its key queue: it moves into the conflict's own keyed queue for that lane (a
``ConflictLane``), where it costs nothing until the conflict is released. A free conflict's
waiters in one lane are equally admissible, and only the first of them can be the lane's next
admission (the first admitted holds the conflict again). So a lane's queue keeps, beside its
heap of key queues, a heap of *waiters*: one entry per conflict lane, recording the place of
its first waiter. It is lazy in the same way: a recorded place is never later than the truth,
a stale entry is pushed again at its true place when it comes to the top, and an entry of a
conflict that is held again is dropped there (its release enters it anew). A charge moves
nothing; whatever makes a waiter's place earlier (a cost or rank gone down, a rise, a key
below its cap again, a job parked ahead of the recorded one) lifts its conflict lane's entry
(``ConflictLane.lift``), as a key queue's new head lifts its entry.

Costs can also go *down* (a shared store says so, or an admission is reverted). Each key knows
its key queues (``KeyState.queues``), parked ones included, so ``reposition`` pushes a fresh
entry for each and lifts the conflict lanes they wait in: O(q log n) for its q queues, never a
scan.

A conflict may be held by a job on another worker (``Conflict.elsewhere``): its holder is then
the ``ELSEWHERE`` sentinel, and waiters park on it exactly as on a local holder.

The records these structures hold (jobs, tiers, lanes, conflicts) are ``jobs.py``'s; this
module keeps them in order, books their rises on the agenda (``aging.py``), parks them on
conflicts and enters their first waiters when they are free (``park_on``, ``release``).

A conflict blocks jobs; a *key* can block too: a key at its ``max_concurrency``, or paused,
runs nothing more until one of its jobs ends or it resumes. Its key queues are taken out of
their heaps whole the first time a decision meets one (``KeyQueue.blocked``, listed in
``KeyState.blocked``), parked ones too; ``unblock`` pushes them back with fresh entries (and
lifts the conflict lanes they wait in) when the key is below its cap again. O(q log n) for its
q key queues, and no decision in between ever looks at them.
"""

from __future__ import annotations

from collections import deque
from heapq import heappop, heappush, heapreplace
from itertools import count
from math import inf as _INF
from math import nextafter
from typing import TYPE_CHECKING, Any

from .aging import URGENT
from .jobs import ELSEWHERE
from .policy import key_holds

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .costs import KeyState
    from .jobs import Conflict, ConflictKey, Job, Lane, PendingQueue

_NEG_URGENT = -URGENT

__all__ = [
    "ConflictLane",
    "KeyQueue",
    "KeyedQueue",
    "best_waiter",
    "or_waiter",
    "park_on",
    "release",
    "reposition",
    "resume_aging",
    "rise",
    "unblock",
]

_next_id = count(1).__next__
"""Unique ids for heap entries: the last tie-breaker, so entries never compare their objects."""


class KeyQueue:
    """One fairness key's jobs inside one keyed queue, by ``(arrival, seq)``.

    Jobs of one key nearly always come in order, so they go to ``fifo``, a deque of jobs sorted
    by ``(arrival, seq)`` because a job is appended only if it comes after the last one appended
    (``last_*``). A job that comes earlier than that (a message redelivered late, a job parked
    after a younger one) goes to ``early``, a heap of ``(arrival, seq, id, job)`` made on first
    use.
    The head is the first live job of either. At a million pending jobs this keeps tuple
    comparisons off the common path, and the deque holds the jobs themselves, so a pending job
    costs the garbage collector one object, not two.

    An entry is live while its job's ``home`` is this queue. A job that leaves and comes back
    to the same queue may leave an old entry that comes alive again; it stands at the job's own
    ``(arrival, seq)`` place, so whichever of the two is met first is right, and the other dies
    when the job leaves.

    ``live`` is the number of jobs whose ``home`` is this queue. ``ver`` is the id of this
    queue's one current entry in its owner's heap (or -1 when it has none); ``rec_*`` are the
    head that entry recorded, never later than the true head.
    """

    __slots__ = (
        "blocked",
        "due",
        "early",
        "fifo",
        "key",
        "last_arrival",
        "last_seq",
        "live",
        "owner",
        "rec_arrival",
        "rec_seq",
        "ver",
    )

    def __init__(self, key: KeyState, owner: KeyedQueue) -> None:
        self.key = key
        self.owner = owner
        self.fifo: deque[Job] = deque()
        self.early: list[tuple[float, int, int, Job]] | None = None
        self.last_arrival = -_INF
        self.last_seq = -1
        self.live = 0
        self.ver = -1
        self.rec_arrival = 0.0
        self.rec_seq = 0
        self.blocked = False
        self.due = 0  # the id of its booking on the agenda (aging lanes only)

    def add(self, job: Job) -> None:
        arrival = job.arrival
        seq = job.seq
        last = self.last_arrival
        fifo = self.fifo
        if not fifo or arrival > last or (arrival == last and seq > self.last_seq):
            fifo.append(job)
            self.last_arrival = arrival
            self.last_seq = seq
        else:
            if self.early is None:
                self.early = []
            heappush(self.early, (arrival, seq, _next_id(), job))

    def head(self, park: bool) -> Job | None:
        """The first live job, dropping stale entries; with ``park``, park blocked heads."""
        fifo = self.fifo
        early = self.early
        while True:
            while fifo and fifo[0].home is not self:
                fifo.popleft()
            while early and early[0][3].home is not self:
                heappop(early)
            if fifo:
                job = fifo[0]
                if early:
                    other = early[0][3]
                    if other.arrival < job.arrival or (
                        other.arrival == job.arrival and other.seq < job.seq
                    ):
                        job = other
            elif early:
                job = early[0][3]
            else:
                return None
            ckey = job.ckey
            if park and ckey is not None:
                conflict = self.owner.conflicts.get(ckey)
                if conflict is not None and conflict.holder is not None:
                    self.remove_head(job)
                    self.live -= 1
                    self.owner.shrink()
                    park_on(conflict, job)
                    continue
            return job

    def remove_head(self, job: Job) -> None:
        """Drop the entry of ``job``, which ``head()`` just returned. O(1), O(log n) if early."""
        fifo = self.fifo
        if fifo and fifo[0] is job:
            fifo.popleft()
        else:
            assert self.early is not None
            heappop(self.early)

    def entries(self) -> Iterator[Job]:
        """Every live job once, in no particular order. O(entries)."""
        seen = set()
        for job in self.fifo:
            if job.home is self and id(job) not in seen:
                seen.add(id(job))
                yield job
        for _, _, _, job in self.early or ():
            if job.home is self and id(job) not in seen:
                seen.add(id(job))
                yield job


class KeyedQueue:
    """Jobs grouped by fairness key, best first by ``(-level, rank, acc, arrival, seq)``.

    ``heap`` holds entries ``(-level, rank, acc, arrival, seq, id, key_queue)``: ``level`` is
    the effective priority of the queue's head (its lane's priority unless the lane ages),
    ``rank`` the key's (``KeyState.rank``). An entry is current when its id
    equals ``key_queue.ver``, and a current entry is never later than the queue's true
    position: costs that go down and heads that rise push fresh entries at once (the latter
    from the agenda, see ``aging.py``). ``queues`` maps each key to its queue; ``size`` counts
    live jobs. ``conflicts`` is the scheduler's registry, where a lane looks up whether a
    head's conflict is held. ``lane`` is the lane whose jobs these are; ``cl`` the conflict
    lane whose waiters this queue holds, ``None`` for a lane's queue. Every key queue in
    ``queues`` is also listed in its key's ``KeyState.queues``. ``waiters`` (a lane's queue
    only) holds the free conflicts' first waiters (``best_waiter``).
    """

    __slots__ = (
        "cl",
        "conflicts",
        "heap",
        "lane",
        "parent",
        "queues",
        "size",
        "tblocked",
        "tenant",
        "trec",
        "tver",
        "waiters",
    )

    def __init__(
        self,
        lane: Lane,
        conflicts: dict[ConflictKey, Conflict] | None = None,
        cl: ConflictLane | None = None,
    ) -> None:
        self.heap: list[tuple[float, float, float, float, int, int, KeyQueue]] = []
        self.queues: dict[KeyState, KeyQueue] = {}
        self.size = 0
        self.conflicts: dict[ConflictKey, Conflict] = {} if conflicts is None else conflicts
        self.lane = lane
        self.cl = cl
        self.waiters: list[tuple[Any, ...]] = []
        # With two-level keys (tenants.py): the tenant queue this is, in ``parent`` (a
        # ``tenants.TenantedQueue``) for ``tenant``: the id of its one current entry there
        # (``tver``, -1: none), what that entry recorded (``trec``), and whether its tenant
        # blocks it (``tblocked``). ``None``/-1/False for a lane's flat queue.
        self.parent: Any = None
        self.tenant: KeyState | None = None
        self.tver = -1
        self.trec: tuple[float, ...] = ()
        self.tblocked = False

    def shrink(self) -> None:
        """One live job fewer (and in the tenanted queue above, if any). O(1)."""
        self.size -= 1
        parent = self.parent
        if parent is not None:
            parent.size -= 1

    def push(self, job: Job) -> None:
        """Add ``job``; O(log n)."""
        key = job.key
        kq = self.queues.get(key)
        if kq is None:
            kq = self.queues[key] = KeyQueue(key, self)
            if key.queues is None:
                key.queues = [kq]
            else:
                key.queues.append(kq)
        job.home = kq
        arrival = job.arrival
        seq = job.seq
        kq.add(job)
        kq.live += 1
        self.size += 1
        parent = self.parent
        if parent is not None:
            parent.size += 1
        if (
            kq.ver < 0
            or arrival < kq.rec_arrival
            or (arrival == kq.rec_arrival and seq < kq.rec_seq)
        ):
            lane = self.lane
            if lane.aging is None:
                if kq.blocked:  # its key is blocked: the queue has no entry until it is not
                    return
                kq.ver = ver = _next_id()
                kq.rec_arrival = arrival
                kq.rec_seq = seq
                if lane.by_key:
                    heappush(self.heap, (key.rank, key.acc, lane.neg_base, arrival, seq, ver, kq))
                else:
                    heappush(self.heap, (lane.neg_base, key.rank, key.acc, arrival, seq, ver, kq))
                if parent is not None:
                    parent.lift(self, lane.place(job), job)
            else:  # a blocked queue's head may be an older job than this one
                self.enter(kq, kq.head(False) if kq.blocked else job)  # type: ignore[arg-type]

    def enter(self, kq: KeyQueue, job: Job) -> bool:
        """Give ``kq``, whose head is ``job``, an entry at its true place and book its next
        rise, or, if its key blocks it, no entry (it is booked for when it turns urgent).
        Whether it got an entry. O(log n)."""
        lane = self.lane
        place = lane.place(job)
        key = kq.key
        if kq.blocked and (place[0] != _NEG_URGENT or key.halted):
            kq.ver = -1
            if lane.aging is not None:
                _book(lane, kq, job, True)
            return False
        kq.ver = ver = _next_id()
        kq.rec_arrival = job.arrival
        kq.rec_seq = job.seq
        heappush(self.heap, (place[0], place[1], place[2], job.arrival, job.seq, ver, kq))
        if lane.aging is not None:
            _book(lane, kq, job, False)
        if self.parent is not None:
            self.parent.lift(self, place, job)
        return True

    def best(self, park: bool) -> Job | None:
        """The first job in order, fixing stale entries on the way; amortised O(log n).

        With ``park``, heads whose conflict is held are parked instead of returned.
        """
        heap = self.heap
        lane = self.lane
        ages = lane.aging is not None
        by_key = lane.by_key
        while heap:
            # The place's three parts: (-level, rank, acc), or (rank, acc, -level) by key.
            p0, p1, p2, _, seq, ver, kq = heap[0]
            if ver != kq.ver:
                heappop(heap)
                continue
            job = kq.head(park)
            if job is None:
                heappop(heap)
                kq.ver = -1
                if kq.live == 0:
                    self._drop(kq)
                continue
            key = kq.key
            if ages:
                t0, t1, t2 = lane.place(job)
                held = key_holds(key, t0)
            else:
                if by_key:
                    t0 = key.rank
                    t1 = key.acc
                    t2 = p2
                else:
                    t0 = p0
                    t1 = key.rank
                    t2 = key.acc
                held = key.running >= key.cap  # key_holds, for a lane that never ages
            if held:  # the key is blocked: its whole queue leaves the heap
                heappop(heap)
                kq.ver = -1
                if not kq.blocked:
                    block(kq)
                if ages:
                    _book(lane, kq, job, True)
                continue
            if t2 == p2 and job.seq == seq and t1 == p1 and t0 == p0:
                if self.waiters:  # a free conflict's first waiter may come first
                    return or_waiter(self, job, heap[0])
                return job
            kq.ver = ver = _next_id()
            kq.rec_arrival = job.arrival
            kq.rec_seq = job.seq
            heapreplace(heap, (t0, t1, t2, job.arrival, job.seq, ver, kq))
            if ages:
                _book(lane, kq, job, False)
        return or_waiter(self, None, None) if self.waiters else None

    def refresh(self) -> None:
        """Rebuild the heap from the true positions; needed after costs went down. O(keys)."""
        self.heap = []
        for kq in list(self.queues.values()):
            job = kq.head(False)
            if job is None:
                kq.ver = -1
                self._drop(kq)
                continue
            self.enter(kq, job)

    def _drop(self, kq: KeyQueue) -> None:
        """Forget the empty key queue ``kq``. O(queues of its key)."""
        key = kq.key
        del self.queues[key]
        queues = key.queues
        if queues is not None:
            queues.remove(kq)
            if not queues:
                key.queues = None
        if not self.queues and self.parent is not None:  # a tenant queue left empty
            self.parent.drop(self)

    def queue_of(self, key: KeyState) -> KeyQueue | None:
        """``key``'s key queue here, if it has one. O(1)."""
        return self.queues.get(key)

    def jobs(self) -> Iterator[Job]:
        """Every live job, in no particular order. O(n)."""
        for kq in self.queues.values():
            yield from kq.entries()


def take(job: Job) -> None:
    """Remove ``job``, which must be the head of its key queue, from its queue. O(log n).

    A blocked key queue has an entry only while its head is urgent (which passes its key's
    cap): taken from one, the job leaves it forgotten if empty, else entered again for its
    new head (an entry only if that one is urgent too)."""
    kq: KeyQueue | None = job.home
    assert kq is not None
    kq.remove_head(job)
    kq.live -= 1
    owner = kq.owner
    owner.size -= 1
    if owner.parent is not None:
        owner.parent.size -= 1
    job.home = None
    if kq.blocked:
        if kq.live == 0:
            _forget_blocked(kq)
        else:
            head = kq.head(False)
            if head is not None:
                kq.owner.enter(kq, head)


def discard(job: Job) -> None:
    """Remove ``job`` from wherever it waits; its entry is dropped lazily. O(1), amortised
    O(log n) for the last waiter of a free conflict (its conflict lane is forgotten)."""
    kq: KeyQueue | None = job.home
    if kq is not None:
        kq.live -= 1
        owner = kq.owner
        owner.shrink()
        job.home = None
        cl = owner.cl
        if kq.blocked and kq.live == 0:  # no entry will ever meet it: forget it now
            _forget_blocked(kq)
        elif owner.tblocked and owner.size == 0:  # nor its blocked tenant's queue here
            for emptied in list(owner.queues.values()):
                owner._drop(emptied)  # (the last one drops the tenant queue from its parent)
            if cl is not None:  # the last waiter of a conflict may have gone with it
                cl.forget_if_empty()
        elif cl is not None and cl.parked.size == 0 and cl.conflict.holder is None:
            cl.enter()  # none waits: forgotten (a held conflict's release does it)


def _forget_blocked(kq: KeyQueue) -> None:
    """Forget the blocked key queue ``kq``, just emptied. O(queues of its key)."""
    kq.blocked = False
    kq.ver = -1
    blocked = kq.key.blocked
    assert blocked is not None
    blocked.remove(kq)
    if not blocked:
        kq.key.blocked = None
    owner = kq.owner
    owner._drop(kq)
    if owner.cl is not None:  # the last waiter of a conflict may have gone with it
        owner.cl.forget_if_empty()


def reposition(key: KeyState) -> None:
    """``key``'s accumulated cost went down: move its key queues back to their true places.

    Each key queue of ``key`` gets a fresh heap entry (older ones die by their id), and each
    conflict lane it waits in is lifted, since an entry recorded with the old cost may now be
    too late. An empty key queue gets none: its entry dies, and the next job pushed
    there records one at the new cost. O(q log n) for the q key queues of ``key``.
    """
    for kq in list(key.queues or ()):
        if not kq.blocked:
            _push_fresh(kq)


def resume_aging(key: KeyState) -> None:
    """``key`` resumed (or its bound moved): its jobs wait, and rise, again. Each of its key
    queues gets a fresh entry and booking (a blocked one, the booking for when it turns
    urgent), and lifts the conflict lane it waits in, if any. O(q log n)."""
    for kq in list(key.queues or ()):
        _push_fresh(kq)


def _push_fresh(kq: KeyQueue) -> None:
    """Give ``kq`` a fresh entry at its true place (older ones die by their id), unless its
    key blocks it, and lift the conflict lane it waits in, if any. O(log n)."""
    job = kq.head(False)
    if job is None:
        kq.ver = -1
        return
    owner = kq.owner
    if owner.enter(kq, job) and owner.cl is not None:
        owner.cl.lift(job)


def rise(kq: KeyQueue) -> None:
    """The agenda says ``kq``'s head has risen a level (or turned urgent): move it up. An
    empty queue's entry dies, so the next job pushed there records (and books) its own."""
    if kq.live:
        _push_fresh(kq)
    else:
        kq.ver = -1


def block(kq: KeyQueue) -> None:
    """``kq``'s key is blocked: keep ``kq`` out of its heap (its entry was just dropped)."""
    kq.blocked = True
    key = kq.key
    if key.blocked is None:
        key.blocked = [kq]
    else:
        key.blocked.append(kq)


def unblock(key: KeyState) -> None:
    """``key`` is below its cap again: put its blocked key queues back, each with a fresh
    entry, lifting the conflict lanes they wait in. O(q log n), q its key queues."""
    queues = key.blocked
    if queues is None:
        return
    key.blocked = None
    for kq in queues:
        kq.blocked = False
        _push_fresh(kq)


def _book(lane: Lane, kq: KeyQueue, job: Job, urgent_only: bool) -> None:
    """Book ``kq``, whose head is ``job``, on the agenda for when that head next rises a
    level (with ``urgent_only``, when it turns urgent). Nothing while the key, its tenant or
    the type is paused (waiting stands still; resuming books again) or when it will not
    rise."""
    aging = lane.aging
    key = job.key
    if aging is None or lane.paused or key.paused or (key.tenant is not None and key.tenant.paused):
        kq.due = 0
        return
    base = lane.tier.priority
    wait = lane.wait(job)
    level = aging.effective(base, wait)
    if aging.is_urgent(base, level):
        kq.due = 0
        return
    bound = job.key.max_priority
    if bound is not None and level >= bound:
        urgent_only = True  # held at its key's bound: it moves again only when urgent
    ceiling = aging.max_effective_priority
    if urgent_only:
        threshold = aging.urgent_threshold
        target_level = None if threshold is None else max(threshold, base + 1)
    else:
        target_level = level + 1
    if target_level is None or (ceiling is not None and target_level > ceiling):
        kq.due = 0
        return
    target = aging.grace + (target_level - base) * aging.interval
    now = lane.agenda.now
    at = now + (target - wait)
    if at <= now:  # rounding: never book the present, or a decision could loop on it
        at = nextafter(now, URGENT)
    lane.agenda.book(kq, at)


def park_on(conflict: Conflict, job: Job) -> None:
    """Park ``job`` (just removed from its lane) until ``conflict``, which is held, is
    released. O(log n)."""
    lane = job.lane
    cl = conflict.lanes.get(lane)
    if cl is None:
        cl = conflict.lanes[lane] = ConflictLane(conflict, lane)
    cl.parked.push(job)
    if cl.ver >= 0 and lane.order(job) < cl.rec:
        cl.ver = -1  # it comes before the place its lane has: the release enters it anew


def release(conflict: Conflict) -> None:
    """``conflict``'s holder is done: its first waiter in each lane may be admitted again.

    A conflict lane whose entry in its lane's waiters is still there keeps it (nothing made a
    waiter's place earlier than it records meanwhile, or it would have been lifted or
    dropped); the others are entered at their first waiter's place. While another worker
    holds it too (``elsewhere``), it stays held by ``ELSEWHERE``. O(lanes · log n).
    """
    if conflict.elsewhere:
        conflict.holder = ELSEWHERE
        return
    conflict.holder = None
    if conflict.lanes:
        for cl in list(conflict.lanes.values()):
            if cl.ver < 0 or cl.parked.size == 0:
                cl.enter()  # (forgets it if none waits)
    conflict.forget_if_idle()


def best_waiter(queue: Any) -> tuple[tuple[Any, ...], Job] | None:
    """The first of the free conflicts' first waiters in ``queue`` (a lane's queue), with its
    entry in ``queue.waiters``; fixing stale entries on the way. Amortised O(log n).

    An entry ``(*order, id, conflict_lane)`` is current while its id is the conflict lane's
    ``ver``; its ``order`` (``Lane.order``) is never later than that of the conflict lane's
    first waiter whose key may start. One of a conflict held again is dropped (its release
    enters it anew), as is one whose waiters' keys all block (their unblocking lifts it).
    """
    waiters = queue.waiters
    lane = queue.lane
    while waiters:
        entry = waiters[0]
        cl = entry[-1]
        if entry[-2] != cl.ver:
            heappop(waiters)
            continue
        if cl.conflict.holder is not None:
            heappop(waiters)
            cl.ver = -1
            continue
        job = cl.parked.best(False)
        if job is None:
            heappop(waiters)
            cl.ver = -1
            cl.forget_if_empty()
            continue
        rec = lane.order(job)
        if rec == entry[:-2]:
            return entry, job
        cl.ver = ver = _next_id()
        cl.rec = rec
        heapreplace(waiters, (*rec, ver, cl))
    return None


def or_waiter(queue: Any, job: Job | None, entry: tuple[Any, ...] | None) -> Job | None:
    """``job``, the first of ``queue``'s own jobs (``entry`` its current entry; both ``None``
    when it has none), or the waiters' first (``best_waiter``) if that comes first."""
    found = best_waiter(queue)
    if found is None or (entry is not None and entry < found[0]):
        return job
    return found[1]


class ConflictLane:
    """The jobs of one lane waiting for one conflict.

    ``parked`` holds them by the lane's order. ``ver`` is the id of its one current entry in
    its lane's ``waiters`` (-1: none), and ``rec`` the order that entry records: never later
    than that of its first waiter whose key may start. While the conflict is free and such a
    waiter exists, it has an entry; while the conflict is held, an entry it kept stays
    right, so its release has nothing to do for it (issue 35: most holds move nothing).
    """

    __slots__ = ("conflict", "lane", "parked", "rec", "ver")

    def __init__(self, conflict: Conflict, lane: Lane) -> None:
        self.conflict = conflict
        self.lane = lane
        # Ordered as its lane's queue is (flat, or two levels deep: tenants.TenantedQueue).
        make: Any = type(lane.queue)
        self.parked: PendingQueue = make(lane, cl=self)
        self.ver = -1
        self.rec: tuple[Any, ...] = ()

    def enter(self) -> None:
        """Give this free conflict lane an entry at its first waiter's place, if a waiter's
        key may start (older entries die by their id); forget it if none waits. O(log n)."""
        job = self.parked.best(False)
        if job is None:
            self.ver = -1
            self.forget_if_empty()
            return
        self.ver = ver = _next_id()
        self.rec = rec = self.lane.order(job)
        heappush(self.lane.queue.waiters, (*rec, ver, self))

    def lift(self, job: Job) -> None:
        """Parked ``job``'s place just moved earlier (a new head, a lower cost or rank, a
        rise, its key below its cap): keep the entry no later than it. O(log n)."""
        if self.ver >= 0:
            rec = self.lane.order(job)
            if rec < self.rec:
                self.ver = ver = _next_id()
                self.rec = rec
                heappush(self.lane.queue.waiters, (*rec, ver, self))
        elif self.conflict.holder is None:
            self.enter()

    def renew(self) -> None:
        """Costs went down or waiting resumed: put its waiters back at their true places
        (``refresh``), then a fresh entry if the conflict is free, else none until its
        release. O(waiting keys)."""
        self.parked.refresh()
        self.ver = -1
        if self.conflict.holder is None:
            self.enter()

    def forget_if_empty(self) -> None:
        """``forget`` if no job waits here. O(1)."""
        if self.parked.size == 0:
            self.forget()

    def forget(self) -> None:
        """No job waits here any more: leave the conflict (which leaves the registry if nobody
        holds it or waits for it either). O(1)."""
        self.ver = -1
        conflict = self.conflict
        if conflict.lanes.get(self.lane) is self:
            del conflict.lanes[self.lane]
            conflict.forget_if_idle()
