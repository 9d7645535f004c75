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
its key queue: it moves into the conflict's own keyed queue for that lane, where it costs
nothing until the conflict is released. On release the conflict does not wake every waiter:
within one lane all its waiters are equally admissible, so only the best of them can be the
lane's next admission. The conflict *lends* that one job back to its lane and records a
bound: the accumulated cost of the next waiter. While the borrower's cost stays below the
bound the loan is right; when the borrower's key is charged past it, the loan is checked again
and possibly moved to the new best waiter (``KeyState.lent`` indexes loans by bound).

Costs can also go *down* (a shared store says so, or an admission is reverted). Each key knows
its key queues (``KeyState.queues``), so ``reposition`` pushes a fresh entry for each and
re-checks the loans of the conflict lanes it waits in: O(q log n) for its q queues, never a scan.

A conflict may be held by a job on another worker (``Conflict.elsewhere``): its holder is then
the ``ELSEWHERE`` sentinel, and waiters park on it exactly as on a local holder.

The records these structures hold (jobs, tiers, lanes, conflicts) are ``jobs.py``'s; this
module keeps them in order, books their rises on the agenda (``aging.py``), parks them on
conflicts and lends them back (``park_on``, ``release``).

A conflict blocks jobs; a *key* can block too: a key at its ``max_concurrency``, or paused,
runs nothing more until one of its jobs ends or it resumes. Its key queues are taken out of
their heaps whole the first time a decision meets one (``KeyQueue.blocked``, listed in
``KeyState.blocked``), and loans it holds are taken back; ``unblock`` pushes them back with
fresh entries when the key is below its cap again. O(q log n) for its q key queues, and no
decision in between ever looks at them.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace
from itertools import count
from math import inf as _INF
from math import nextafter
from typing import TYPE_CHECKING, Any

from .aging import URGENT
from .jobs import ELSEWHERE
from .policy import comes_before, key_blocks, key_holds

if TYPE_CHECKING:
    from collections.abc import Iterator

    from .costs import KeyState
    from .jobs import Conflict, ConflictKey, Job, Lane, PendingQueue, Place

_NEG_URGENT = -URGENT
_NO_BOUND = (3, 0.0)
"""A loan's bound that no charge reaches (a key's rank is 0, 1 or 2)."""

__all__ = [
    "ConflictLane",
    "KeyQueue",
    "KeyedQueue",
    "lender",
    "park_on",
    "recheck_loans",
    "release",
    "reposition",
    "resume_aging",
    "rise",
    "take_back_loans",
    "unblock",
]

_next_id = count(1).__next__
"""Unique ids for heap entries: the last tie-breaker, so entries never compare their objects."""


class KeyQueue:
    """One fairness key's jobs inside one keyed queue, by ``(arrival, seq)``.

    Jobs of one key nearly always come in order, so they go to ``fifo``, a deque of jobs sorted
    by ``(arrival, seq)`` because a job is appended only if it comes after the last one appended
    (``last_*``). A job that comes earlier than that (a message redelivered late, a job lent back
    by a conflict) goes to ``early``, a heap of ``(arrival, seq, id, job)`` made on first use.
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
    ``queues`` is also listed in its key's ``KeyState.queues``.
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
                return job
            kq.ver = ver = _next_id()
            kq.rec_arrival = job.arrival
            kq.rec_seq = job.seq
            heapreplace(heap, (t0, t1, t2, job.arrival, job.seq, ver, kq))
            if ages:
                _book(lane, kq, job, False)
        return None

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

    def min_place_excluding(self, key: KeyState) -> Place | None:
        """A lower bound of the place ``(-level, rank, acc)`` of every key but ``key`` with
        jobs here.

        Every entry's recorded place is at most its key's current one, so the least entry of
        another key with live jobs is such a bound. Walks only past ``key``'s own and empty
        entries: O(1 + those entries).
        """
        heap = self.heap
        if not heap:
            return None
        entry = heap[0]
        kq = entry[6]
        if kq.key is not key and kq.live:  # the least entry is another key's
            return (entry[0], entry[1], entry[2])
        size = len(heap)
        best: Place | None = None
        stack = [1, 2]
        while stack:
            i = stack.pop()
            if i >= size:
                continue
            entry = heap[i]
            place = (entry[0], entry[1], entry[2])
            if best is not None and place >= best:
                continue
            kq = entry[6]
            if kq.key is key or kq.live == 0:
                stack.append(2 * i + 1)
                stack.append(2 * i + 2)
            else:
                best = place
        return best

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
    """Remove ``job`` from wherever it waits; its entry is dropped lazily. O(1)."""
    kq: KeyQueue | None = job.home
    if kq is not None:
        kq.live -= 1
        owner = kq.owner
        owner.shrink()
        job.home = None
        if kq.blocked and kq.live == 0:  # no entry will ever meet it: forget it now
            _forget_blocked(kq)
        elif owner.tblocked and owner.size == 0:  # nor its blocked tenant's queue here
            for emptied in list(owner.queues.values()):
                owner._drop(emptied)  # (the last one drops the tenant queue from its parent)
            if owner.cl is not None:  # the last waiter of a conflict may have gone with it
                owner.cl._forget_if_empty()


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
        owner.cl._forget_if_empty()


def reposition(key: KeyState) -> None:
    """``key``'s accumulated cost went down: move its key queues back to their true places.

    Each key queue of ``key`` gets a fresh heap entry (older ones die by their id), and each
    conflict lane it waits in checks its loan again, since a bound recorded with the old cost
    may now be too high. An empty key queue gets none: its entry dies, and the next job pushed
    there records one at the new cost. O(q log n) for the q key queues of ``key``.
    """
    for kq in list(key.queues or ()):
        if not kq.blocked:
            _push_fresh(kq)


def resume_aging(key: KeyState) -> None:
    """``key`` resumed (or its bound moved): its jobs wait, and rise, again. Each of its key
    queues gets a fresh entry and booking (a blocked one, the booking for when it turns
    urgent), and each conflict that lent one of its jobs checks the loan again: a lowered
    bound may put the loan behind another key's waiter. O(q log n + loans log n)."""
    for kq in list(key.queues or ()):
        _push_fresh(kq)
    for _, ident, cl in list(lender(key).lent):
        if cl.bound_id == ident and cl.lent is not None and _borrows(cl.lent.key, key):
            cl.revalidate()


def _push_fresh(kq: KeyQueue) -> None:
    """Give ``kq`` a fresh entry at its true place (older ones die by their id), unless its
    key blocks it, and let the conflict lane it waits in, if any, check its loan again.
    O(log n)."""
    job = kq.head(False)
    if job is None:
        kq.ver = -1
        return
    owner = kq.owner
    if owner.enter(kq, job) and owner.cl is not None:
        owner.cl.revalidate()


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
    entry, and let the conflict lanes it waits in lend again. O(q log n), q its key queues."""
    queues = key.blocked
    if queues is None:
        return
    key.blocked = None
    for kq in queues:
        kq.blocked = False
        _push_fresh(kq)


def take_back_loans(key: KeyState) -> None:
    """``key`` (or tenant) just became blocked: the conflict lanes that lent it a job lend
    another key's waiter instead. Only loans registered with a bound can have another key to
    lend to. With two-level keys a key's loans are registered with its tenant
    (``lender``). O(loans of the key, or of its tenant · log n)."""
    for _, ident, cl in list(lender(key).lent):
        if cl.bound_id == ident and cl.lent is not None and _borrows(cl.lent.key, key):
            cl.revalidate()


def lender(key: KeyState) -> KeyState:
    """Where the loans to ``key``'s jobs are registered: its tenant's ``lent`` with two-level
    keys (a charge to any of the tenant's keys moves them all), else its own."""
    tenant = key.tenant
    return key if tenant is None else tenant


def _borrows(borrower: KeyState, holder: KeyState) -> bool:
    """Whether a loan to a job of ``borrower`` is ``holder``'s: its key's or its tenant's."""
    return borrower is holder or borrower.tenant is holder


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
    """Park ``job`` (just removed from its lane) until ``conflict`` is released."""
    cl = conflict.lanes.get(job.lane)
    if cl is None:
        cl = conflict.lanes[job.lane] = ConflictLane(conflict, job.lane)
    lent_from: ConflictLane | None = job.lent_from
    if lent_from is not None:
        lent_from.lent = None
        job.lent_from = None
    cl.parked.push(job)
    cl.moved = True


def release(conflict: Conflict) -> None:
    """``conflict``'s holder is done: lend the best waiter of each lane to its lane.

    While another worker holds it too (``elsewhere``), it stays held by ``ELSEWHERE``.
    """
    if conflict.elsewhere:
        conflict.holder = ELSEWHERE
        return
    conflict.holder = None
    if conflict.lanes:
        for cl in list(conflict.lanes.values()):
            if cl.moved or cl.lent is None or cl.bound_id == 0:
                cl.revalidate()
            # else its loan, still in its lane, and the loan's bound are as the hold found
            # them: nothing its order depends on moved meanwhile, so both are right still.
    conflict.forget_if_idle()


class ConflictLane:
    """The jobs of one lane waiting for one conflict.

    ``parked`` holds them by the lane's order. While the conflict is free, ``lent`` is the best
    of them by that order, moved back into the lane, and no parked job comes before it; the
    loan is registered in the borrower key's ``lent`` heap under a *bound*: a lower bound of the
    accumulated cost of every parked job of another key (``bound_id`` its id there, 0 when none
    is registered).

    While the conflict is held nothing is lent, but a loan made before stays in its lane (it is
    parked when its lane meets it). ``moved`` records that something the loan depends on moved
    while held (a waiter parked, a place changed, its registration consumed): only then does the
    release check the loan again. Most loans come through a hold untouched (issue 35: in the
    simulator's burst, 161,571 of the 235,023 checks at releases found the loan as it was).
    """

    __slots__ = ("bound_id", "conflict", "lane", "lent", "moved", "parked")

    def __init__(self, conflict: Conflict, lane: Lane) -> None:
        self.conflict = conflict
        self.lane = lane
        # Ordered as its lane's queue is (flat, or two levels deep: tenants.TenantedQueue).
        make: Any = type(lane.queue)
        self.parked: PendingQueue = make(lane, cl=self)
        self.lent: Job | None = None
        self.bound_id = 0
        self.moved = False

    def revalidate(self) -> None:
        """Make ``lent`` the best waiter again (if the conflict is free; while it is held,
        note that the release must). O(log n)."""
        if self.conflict.holder is not None:
            self.moved = True
            return
        self.moved = False
        parked = self.parked
        best = parked.best(False)
        lent = self.lent
        if lent is not None:
            blocks = key_blocks(lent)
            if not blocks and (best is None or comes_before(lent, best)):
                self._register(lent)
                return
            # A parked job now comes first, or its key blocks it: take the loan back.
            discard(lent)
            lent.lent_from = None
            self.lent = None
            parked.push(lent)
            if blocks:  # (with no parked waiter it returned above unless the key blocks)
                best = parked.best(False)
            # else ``best`` comes before the loan and stays first: its key's other parked
            # jobs come after it, and the loan after it too (most moves in a burst).
        if best is None:
            self._forget_if_empty()
            return
        take(best)
        self.lane.queue.push(best)
        best.lent_from = self
        self.lent = best
        self._register(best)

    def _register(self, lent: Job) -> None:
        # Parked jobs of the borrower's own key come after the loan by (arrival, seq) for
        # good (the older a job of a lane and key, the higher it has risen), so only the
        # other keys' places can ever overtake it: by the borrower's key being charged past
        # them within one level (registered here), or by rising (the agenda revalidates).
        self.bound_id = ident = _next_id()
        bound = self.parked.min_place_excluding(lent.key)
        if bound is None:
            return
        holder = lender(lent.key)
        loans = holder.lent
        if len(loans) > 64:  # drop loans long moved on, which no charge may ever reach
            holder.lent = loans = [e for e in loans if e[2].bound_id == e[1]]
            heapify(loans)
        lane = self.lane
        if lane.by_key:  # (rank, acc, -level): a charge moves it past the others' (rank, acc)
            mine = lane.place(lent)[0]
            if mine == _NEG_URGENT or bound[0] == _NEG_URGENT:
                # It is urgent and goes by age, or they are: no charge can move the loan.
                heappush(loans, (_NO_BOUND if mine == _NEG_URGENT else (-1, 0.0), ident, self))
            else:
                heappush(loans, ((bound[0], bound[1]), ident, self))
            return
        level = bound[0] if lane.aging is None else lane.place(lent)[0]
        if bound[0] == level and level != _NEG_URGENT:
            heappush(loans, ((bound[1], bound[2]), ident, self))
        elif bound[0] > level:
            # They are a level below, or it is urgent and goes by age: no charge can move the
            # loan (rising can: the agenda revalidates), but a block must find it.
            heappush(loans, (_NO_BOUND, ident, self))
        else:  # a stale entry of a higher level: check again at the next charge
            heappush(loans, ((-1, 0.0), ident, self))

    def on_lent_gone(self) -> None:
        """The lent job left (admitted or cancelled); lend the next one if still free."""
        self.lent = None
        self.bound_id = 0
        self.revalidate()

    def _forget_if_empty(self) -> None:
        if self.lent is None and self.parked.size == 0:
            conflict = self.conflict
            if conflict.lanes.get(self.lane) is self:
                del conflict.lanes[self.lane]
                conflict.forget_if_idle()


def recheck_loans(key: KeyState) -> None:
    """``key`` (or tenant) was charged: re-examine the loans whose bound its cost has reached.

    Amortised O(log n) per loan examined; a loan is examined only when its borrower's cost
    crossed the recorded bound, i.e. when the loan may really have to move. With two-level
    keys the bounds are a tenant's ``(rank, acc)``; a loan whose next waiter is of the same
    tenant has a bound its tenant always reaches, and is examined at each of its tenant's
    charges (O(such loans)).
    """
    key = lender(key)
    lent = key.lent
    due = []
    place = (key.rank, key.acc)
    while lent and lent[0][0] <= place:
        due.append(heappop(lent))
    # Each loan is examined once per charge: a loan still right after a tie on cost is
    # registered again with a bound the key already reached, and must wait for the next charge.
    for _, ident, cl in due:
        if cl.bound_id == ident and cl.lent is not None and _borrows(cl.lent.key, key):
            cl.bound_id = 0  # consumed: registered again by the check (or by the release)
            cl.revalidate()
