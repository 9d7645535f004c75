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
from typing import TYPE_CHECKING

from .aging import URGENT, Agenda, PauseLog, paused_within
from .costs import UNLIMITED, cap_left
from .policy import comes_before, key_blocks, key_holds
from .types import JobState

if TYPE_CHECKING:
    from collections.abc import Hashable, Iterator

    from .costs import KeyState
    from .types import Aging, JobType

Place = tuple[float, int, float]
"""The part of a job's place in the order that its key queue shares: ``(-level, rank, acc)``.
``level`` is its effective priority (``URGENT`` once it has aged into urgency, when ``rank``
and ``acc`` no longer count and are 0)."""

_NEG_URGENT = -URGENT
_NO_BOUND = (3, 0.0)
"""A loan's bound that no charge reaches (a key's rank is 0, 1 or 2)."""

__all__ = [
    "ELSEWHERE",
    "Conflict",
    "ConflictLane",
    "KeyQueue",
    "KeyedQueue",
    "Lane",
    "PendingJob",
    "SideLane",
    "Tier",
    "reposition",
    "resume_aging",
    "rise",
    "take_back_loans",
    "unblock",
]

ConflictKey = tuple[str, str]
"""``(conflict group, job_id)``."""

_next_id = count(1).__next__
"""Unique ids for heap entries: the last tie-breaker, so entries never compare their objects."""


class PendingJob:
    """The core's record of one submitted job (pending or running).

    ``ckey`` is its ``(conflict group, job_id)``, or ``None`` when it can conflict with nothing.
    ``home`` is the key queue holding it (``None`` once admitted or cancelled); a queue entry is
    valid only while the job's ``home`` is that queue, so leaving a queue is O(1) and entries
    left behind are dropped when they reach the front. ``lent_from`` is the conflict lane that
    lent it to its lane, if any.
    """

    __slots__ = (
        "admitted_at",
        "arrival",
        "charge",
        "ckey",
        "cost",
        "effective",
        "estimate",
        "home",
        "job_id",
        "key",
        "lane",
        "lent_from",
        "ref",
        "seq",
        "state",
        "token",
    )

    def __init__(
        self,
        ref: Hashable,
        lane: Lane,
        job_id: str | None,
        key: KeyState,
        arrival: float,
        seq: int,
        cost: float | None,
        ckey: ConflictKey | None,
    ) -> None:
        self.ref = ref
        self.lane = lane
        self.job_id = job_id
        self.key = key
        self.arrival = arrival
        self.seq = seq
        self.cost = cost
        self.ckey = ckey
        self.home: KeyQueue | None = None
        self.lent_from: ConflictLane | None = None
        self.state = JobState.PENDING
        # estimate, charge, token, admitted_at and effective (its effective priority and
        # urgency then) are set at admission and read only after it.
        self.effective: tuple[int, bool]
        self.estimate: float
        self.charge: float
        self.token: int
        self.admitted_at: float

    def order(self) -> tuple[float, int, float, float, int]:
        """The job's place in the dispatch order at the lane agenda's ``now``, smallest first."""
        level, rank, acc = self.lane.place(self)
        return (level, rank, acc, self.arrival, self.seq)

    def __repr__(self) -> str:
        return (
            f"<PendingJob {self.ref!r} {self.lane.type.name}:{self.job_id} "
            f"key={self.key.name!r} {self.state.value}>"
        )


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
        self.fifo: deque[PendingJob] = deque()
        self.early: list[tuple[float, int, int, PendingJob]] | None = None
        self.last_arrival = -_INF
        self.last_seq = -1
        self.live = 0
        self.ver = -1
        self.rec_arrival = 0.0
        self.rec_seq = 0
        self.blocked = False
        self.due = 0  # the id of its booking on the agenda (aging lanes only)

    def add(self, job: PendingJob) -> None:
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

    def head(self, park: bool) -> PendingJob | None:
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
                    self.owner.size -= 1
                    conflict.park(job)
                    continue
            return job

    def remove_head(self, job: PendingJob) -> None:
        """Drop the entry of ``job``, which ``head()`` just returned. O(1), O(log n) if early."""
        fifo = self.fifo
        if fifo and fifo[0] is job:
            fifo.popleft()
        else:
            assert self.early is not None
            heappop(self.early)

    def entries(self) -> Iterator[PendingJob]:
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

    __slots__ = ("cl", "conflicts", "heap", "lane", "queues", "size")

    def __init__(
        self,
        lane: Lane,
        conflicts: dict[ConflictKey, Conflict] | None = None,
        cl: ConflictLane | None = None,
    ) -> None:
        self.heap: list[tuple[float, int, float, float, int, int, KeyQueue]] = []
        self.queues: dict[KeyState, KeyQueue] = {}
        self.size = 0
        self.conflicts: dict[ConflictKey, Conflict] = {} if conflicts is None else conflicts
        self.lane = lane
        self.cl = cl

    def push(self, job: PendingJob) -> None:
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
                heappush(self.heap, (lane.neg_base, key.rank, key.acc, arrival, seq, ver, kq))
            else:  # a blocked queue's head may be an older job than this one
                self.enter(kq, kq.head(False) if kq.blocked else job)  # type: ignore[arg-type]

    def enter(self, kq: KeyQueue, job: PendingJob) -> bool:
        """Give ``kq``, whose head is ``job``, an entry at its true place and book its next
        rise, or, if its key blocks it, no entry (it is booked for when it turns urgent).
        Whether it got an entry. O(log n)."""
        lane = self.lane
        place = lane.place(job)
        key = kq.key
        if kq.blocked and (place[0] != _NEG_URGENT or key.paused):
            kq.ver = -1
            if lane.aging is not None:
                lane.book(kq, job, True)
            return False
        kq.ver = ver = _next_id()
        kq.rec_arrival = job.arrival
        kq.rec_seq = job.seq
        heappush(self.heap, (place[0], place[1], place[2], job.arrival, job.seq, ver, kq))
        if lane.aging is not None:
            lane.book(kq, job, False)
        return True

    def best(self, park: bool) -> PendingJob | None:
        """The first job in order, fixing stale entries on the way; amortised O(log n).

        With ``park``, heads whose conflict is held are parked instead of returned.
        """
        heap = self.heap
        lane = self.lane
        ages = lane.aging is not None
        while heap:
            level, rank, acc, _, seq, ver, kq = heap[0]
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
                true_level, true_rank, true_acc = lane.place(job)
                held = key_holds(key, true_level)
            else:
                true_level = level
                true_rank = key.rank
                true_acc = key.acc
                held = key.running >= key.cap  # key_holds, for a lane that never ages
            if held:  # the key is blocked: its whole queue leaves the heap
                heappop(heap)
                kq.ver = -1
                if not kq.blocked:
                    block(kq)
                if ages:
                    lane.book(kq, job, True)
                continue
            if true_acc == acc and job.seq == seq and true_rank == rank and true_level == level:
                return job
            kq.ver = ver = _next_id()
            kq.rec_arrival = job.arrival
            kq.rec_seq = job.seq
            heapreplace(heap, (true_level, true_rank, true_acc, job.arrival, job.seq, ver, kq))
            if ages:
                lane.book(kq, job, False)
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

    def min_place_excluding(self, key: KeyState) -> Place | None:
        """A lower bound of the place ``(-level, rank, acc)`` of every key but ``key`` with
        jobs here.

        Every entry's recorded place is at most its key's current one, so the least entry of
        another key with live jobs is such a bound. Walks only past ``key``'s own and empty
        entries: O(1 + those entries).
        """
        heap = self.heap
        size = len(heap)
        best: Place | None = None
        stack = [0] if heap else []
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

    def jobs(self) -> Iterator[PendingJob]:
        """Every live job, in no particular order. O(n)."""
        for kq in self.queues.values():
            yield from kq.entries()


def take(job: PendingJob) -> None:
    """Remove ``job``, which must be the head of its key queue, from its queue. O(log n).

    A blocked key queue has an entry only while its head is urgent (which passes its key's
    cap): taken from one, the job leaves it forgotten if empty, else entered again for its
    new head (an entry only if that one is urgent too)."""
    kq = job.home
    assert kq is not None
    kq.remove_head(job)
    kq.live -= 1
    kq.owner.size -= 1
    job.home = None
    if kq.blocked:
        if kq.live == 0:
            _forget_blocked(kq)
        else:
            head = kq.head(False)
            if head is not None:
                kq.owner.enter(kq, head)


def discard(job: PendingJob) -> None:
    """Remove ``job`` from wherever it waits; its entry is dropped lazily. O(1)."""
    kq = job.home
    if kq is not None:
        kq.live -= 1
        kq.owner.size -= 1
        job.home = None
        if kq.blocked and kq.live == 0:  # no entry will ever meet it: forget it now
            _forget_blocked(kq)


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
    """``key`` resumed: its jobs wait, and rise, again. Each of its key queues gets a fresh
    entry and booking (a blocked one, the booking for when it turns urgent). O(q log n)."""
    for kq in list(key.queues or ()):
        _push_fresh(kq)


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
    """``key`` just became blocked: the conflict lanes that lent it a job lend another key's
    waiter instead. Only loans registered with a bound can have another key to lend to.
    O(loans of the key · log n)."""
    for _, ident, cl in list(key.lent):
        if cl.bound_id == ident and cl.lent is not None and cl.lent.key is key:
            cl.revalidate()


class Tier:
    """All lanes of one priority.

    ``running`` is the number of admitted, not yet released jobs of this tier; ``pending``
    the number of pending ones (parked included). ``limit`` is the tier's cap, ``elsewhere``
    the jobs of this tier that other workers run (as a shared store last said), and ``cap``
    what this scheduler may run: ``limit - elsewhere`` (``UNLIMITED`` stays unlimited).
    """

    __slots__ = ("cap", "elsewhere", "lanes", "limit", "pending", "priority", "running")

    def __init__(self, priority: int, cap: int) -> None:
        self.priority = priority
        self.limit = self.cap = cap
        self.elsewhere = 0
        self.lanes: list[Lane] = []
        self.running = 0
        self.pending = 0


class Lane:
    """The pending jobs of one job type.

    ``running`` is the number of admitted, not yet released jobs of this type; ``pending``
    the number of pending ones (parked included); ``queue`` holds the pending jobs that are
    not parked on a held conflict. ``limit``, ``elsewhere`` and ``cap`` as for ``Tier``; a
    ``paused`` type has ``cap`` 0, so a decision skips its lane in O(1) like a full one.
    ``aging`` is how its jobs rise (``None``: they do not), ``agenda`` the scheduler's, and
    ``pauses`` the log of the type's pauses (``None`` until it is first paused).
    """

    __slots__ = (
        "agenda",
        "aging",
        "cap",
        "elsewhere",
        "limit",
        "neg_base",
        "paused",
        "pauses",
        "pending",
        "queue",
        "running",
        "tier",
        "type",
    )

    def __init__(
        self,
        jtype: JobType,
        tier: Tier,
        conflicts: dict[ConflictKey, Conflict],
        agenda: Agenda,
        aging: Aging | None = None,
    ) -> None:
        self.type = jtype
        self.tier = tier
        cap = UNLIMITED if jtype.max_concurrency is None else jtype.max_concurrency
        self.limit = self.cap = cap
        self.elsewhere = 0
        self.paused = False
        self.pauses: PauseLog | None = None
        self.running = 0
        self.pending = 0
        self.neg_base = -tier.priority
        self.agenda = agenda
        self.aging = aging if aging is not None and aging.ages(tier.priority) else None
        self.queue = KeyedQueue(self, conflicts)

    def recap(self) -> None:
        """Compute ``cap`` again: 0 while ``paused``, else ``limit - elsewhere``. O(1)."""
        self.cap = cap_left(self.limit, self.elsewhere, self.paused)

    def wait(self, job: PendingJob) -> float:
        """How long ``job`` has waited at the agenda's ``now``, less the time its key or its
        type was paused since it arrived. O(1) unless one of them was ever paused."""
        now = self.agenda.now
        wait = now - job.arrival
        kp = job.key.pauses
        if kp is not None or self.pauses is not None:
            wait -= paused_within((kp, self.pauses), job.arrival, now)
        return wait

    def effective(self, job: PendingJob) -> tuple[int, bool]:
        """``job``'s effective priority now, and whether it has aged into urgency."""
        aging = self.aging
        base = self.tier.priority
        if aging is None:
            return base, False
        level = aging.effective(base, self.wait(job))
        return level, aging.is_urgent(base, level)

    def place(self, job: PendingJob) -> Place:
        """``(-level, rank, acc)`` of ``job`` now: what its key queue's entry records."""
        key = job.key
        if self.aging is None:
            return (self.neg_base, key.rank, key.acc)
        level, urgent = self.effective(job)
        if urgent:
            return (_NEG_URGENT, 0, 0.0)
        return (-level, key.rank, key.acc)

    def book(self, kq: KeyQueue, job: PendingJob, urgent_only: bool) -> None:
        """Book ``kq``, whose head is ``job``, on the agenda for when that head next rises a
        level (with ``urgent_only``, when it turns urgent). Nothing while the key or the type
        is paused (waiting stands still; resuming books again) or when it will not rise."""
        aging = self.aging
        if aging is None or self.paused or job.key.paused:
            kq.due = 0
            return
        base = self.tier.priority
        wait = self.wait(job)
        level = aging.effective(base, wait)
        if aging.is_urgent(base, level):
            kq.due = 0
            return
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
        now = self.agenda.now
        at = now + (target - wait)
        if at <= now:  # rounding: never book the present, or a decision could loop on it
            at = nextafter(now, URGENT)
        self.agenda.book(kq, at)


def _forwarded(name: str) -> property:
    """An attribute of a side lane that is its type's lane's (``SideLane``)."""

    def get(self: SideLane) -> object:
        return getattr(self.home, name)

    def put(self: SideLane, value: object) -> None:
        setattr(self.home, name, value)

    return property(get, put, doc=f"The type's ``{name}`` (its home lane's).")


class SideLane(Lane):
    """The pending jobs of one type that were given a priority other than the type's own.

    A job submitted or reprioritised at priority ``p`` waits in its type's side lane at ``p``:
    in tier ``p``, with a queue and aging of its own, so it is ordered, aged and counted
    against the tier cap at ``p`` like any job of that tier. What belongs to the type (its
    counts, its cap and what runs elsewhere, its pause) is not the side lane's own: every one
    of those attributes reads and writes ``home``, the type's lane, so the type's cap spans all
    its lanes and a pause stops them all. A type without such jobs has no side lane, and the
    type's own lane pays nothing for them.
    """

    __slots__ = ("home",)

    running = _forwarded("running")
    pending = _forwarded("pending")
    limit = _forwarded("limit")
    elsewhere = _forwarded("elsewhere")
    cap = _forwarded("cap")
    paused = _forwarded("paused")
    pauses = _forwarded("pauses")

    def __init__(
        self,
        home: Lane,
        tier: Tier,
        conflicts: dict[ConflictKey, Conflict],
        aging: Aging | None,
    ) -> None:
        # Not Lane.__init__: that would reset the type's counts through the forwarded names.
        self.home = home
        self.type = home.type
        self.tier = tier
        self.neg_base = -tier.priority
        self.agenda = home.agenda
        self.aging = aging if aging is not None and aging.ages(tier.priority) else None
        self.queue = KeyedQueue(self, conflicts)


class Conflict:
    """One ``(conflict group, job_id)`` that is held or waited for.

    It exists in ``registry`` (the scheduler's) exactly while a job holds it or a conflict
    lane waits on it, so the many jobs whose ids never meet cost no conflict object at all.
    ``holder`` is the running job that holds it, if any, or ``ELSEWHERE`` while only a job on
    another worker does; ``elsewhere`` says a shared store reported it held by another worker
    (it stays held after a local holder is released, until the store says it is free);
    ``lanes`` maps each lane to the conflict lane of jobs parked (or lent) there.
    """

    __slots__ = ("elsewhere", "holder", "key", "lanes", "registry")

    def __init__(self, key: ConflictKey, registry: dict[ConflictKey, Conflict]) -> None:
        self.key = key
        self.registry = registry
        self.holder: PendingJob | None = None
        self.elsewhere = False
        self.lanes: dict[Lane, ConflictLane] = {}

    def forget_if_idle(self) -> None:
        """Leave the registry once nobody holds or waits for this conflict."""
        if self.holder is None and not self.lanes and self.registry.get(self.key) is self:
            del self.registry[self.key]

    def park(self, job: PendingJob) -> None:
        """Park ``job`` (just removed from its lane) until this conflict is released."""
        cl = self.lanes.get(job.lane)
        if cl is None:
            cl = self.lanes[job.lane] = ConflictLane(self, job.lane)
        if job.lent_from is not None:
            job.lent_from.lent = None
            job.lent_from = None
        cl.parked.push(job)

    def release(self) -> None:
        """The holder is done: lend the best waiter of each lane to its lane.

        While another worker holds it too (``elsewhere``), it stays held by ``ELSEWHERE``.
        """
        if self.elsewhere:
            self.holder = ELSEWHERE
            return
        self.holder = None
        if self.lanes:
            for cl in list(self.lanes.values()):
                cl.revalidate()
        self.forget_if_idle()

    def __repr__(self) -> str:
        return f"<Conflict {self.key[0]}:{self.key[1]} holder={self.holder!r}>"


class ConflictLane:
    """The jobs of one lane waiting for one conflict.

    ``parked`` holds them by the lane's order. While the conflict is free, ``lent`` is the best
    of them by that order, moved back into the lane, and no parked job comes before it; the
    loan is registered in the borrower key's ``lent`` heap under a *bound*: a lower bound of the
    accumulated cost of every parked job of another key.
    """

    __slots__ = ("bound_id", "conflict", "lane", "lent", "parked")

    def __init__(self, conflict: Conflict, lane: Lane) -> None:
        self.conflict = conflict
        self.lane = lane
        self.parked = KeyedQueue(lane, cl=self)
        self.lent: PendingJob | None = None
        self.bound_id = 0

    def revalidate(self) -> None:
        """Make ``lent`` the best waiter again (if the conflict is free). O(log n)."""
        if self.conflict.holder is not None:
            return
        parked = self.parked
        best = parked.best(False)
        lent = self.lent
        if lent is not None:
            if not key_blocks(lent) and (best is None or comes_before(lent, best)):
                self._register(lent)
                return
            # A parked job now comes first: take the loan back.
            discard(lent)
            lent.lent_from = None
            self.lent = None
            parked.push(lent)
            best = parked.best(False)
        if best is None:
            self._forget_if_empty()
            return
        take(best)
        self.lane.queue.push(best)
        best.lent_from = self
        self.lent = best
        self._register(best)

    def _register(self, lent: PendingJob) -> None:
        # Parked jobs of the borrower's own key come after the loan by (arrival, seq) for
        # good (the older a job of a lane and key, the higher it has risen), so only the
        # other keys' places can ever overtake it: by the borrower's key being charged past
        # them within one level (registered here), or by rising (the agenda revalidates).
        self.bound_id = ident = _next_id()
        bound = self.parked.min_place_excluding(lent.key)
        if bound is None:
            return
        key = lent.key
        loans = key.lent
        if len(loans) > 64:  # drop loans long moved on, which no charge may ever reach
            key.lent = loans = [e for e in loans if e[2].bound_id == e[1]]
            heapify(loans)
        level = bound[0] if self.lane.aging is None else self.lane.place(lent)[0]
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
    """``key`` was charged: re-examine the loans whose bound its cost has reached.

    Amortised O(log n) per loan examined; a loan is examined only when its borrower's cost
    crossed the recorded bound, i.e. when the loan may really have to move.
    """
    lent = key.lent
    due = []
    place = (key.rank, key.acc)
    while lent and lent[0][0] <= place:
        due.append(heappop(lent))
    # Each loan is examined once per charge: a loan still right after a tie on cost is
    # registered again with a bound the key already reached, and must wait for the next charge.
    for _, ident, cl in due:
        if cl.bound_id == ident and cl.lent is not None and cl.lent.key is key:
            cl.revalidate()


class _Elsewhere(PendingJob):
    """The holder of a conflict that only a job on another worker holds."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<held elsewhere>"


ELSEWHERE: PendingJob = _Elsewhere()
"""``Conflict.holder`` while a job of another worker, and none of ours, holds the conflict."""
