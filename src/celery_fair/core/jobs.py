"""The records of the pending index: a job, a tier, a lane, a conflict.

``fairqueue.py`` keeps these in order and in its wait lists, and ``policy.py`` reads them to
decide what is admissible; both import them from here, and this module imports neither, so the
index depends on the rule and the rule on the records, never the other way round. What a record
holds of the index itself (the key queue a job waits in, a lane queue's waiters, a
conflict's lanes) is ``fairqueue``'s, typed here only as far as the records and the rule use it
(``PendingQueue``, ``Any``). A lane also says where its jobs stand in the order (``Lane.place``):
their effective priority as they age, their key's rank and accumulated cost.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from .aging import URGENT, paused_within
from .costs import UNLIMITED, cap_left
from .types import JobState

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    from .aging import Agenda, PauseLog
    from .costs import KeyState
    from .types import Aging, JobType

__all__ = [
    "ELSEWHERE",
    "Conflict",
    "ConflictKey",
    "Job",
    "Lane",
    "Order",
    "PendingQueue",
    "Place",
    "SideLane",
    "Tier",
    "widen",
]

Place = tuple[float, float, float]
"""The part of a job's place in the order that its key queue shares: ``(-level, rank, acc)``
with priority scope ``"global"``, ``(rank, acc, -level)`` with ``"key"``. ``level`` is its
effective priority. Once it has aged into urgency the place is ``(-URGENT, 0, 0)`` in both
scopes (``rank``, ``acc`` and ``level`` no longer count), so ``place[0] == -URGENT`` says
urgent whatever the scope."""

Order = tuple[float, ...]
"""A job's whole place in the order, smallest first (``Lane.order``): its ``Place`` (widened
with its tenant's rank and cost with two-level keys, ``widen``), then arrival and seq."""

ConflictKey = tuple[str, str]
"""``(conflict group, job_id)``."""

_NEG_URGENT = -URGENT


class PendingQueue(Protocol):
    """A lane's queue of pending jobs (``fairqueue.KeyedQueue``), as the rule and the scheduler
    use it: ``size`` live jobs, the best of them, and the ways jobs come in and order returns."""

    size: int
    waiters: list[tuple[Any, ...]]  # (a lane's queue) free conflicts' first waiters

    def best(self, park: bool) -> Job | None:
        """The first job in order (with ``park``, parking heads whose conflict is held)."""

    def push(self, job: Job) -> None:
        """Add ``job``."""

    def refresh(self) -> None:
        """Put every key queue back at its true place (costs went down)."""

    def queue_of(self, key: KeyState) -> Any:
        """``key``'s key queue here (a ``fairqueue.KeyQueue``), or ``None``."""


class Job:
    """The core's record of one submitted job (pending or running).

    ``ckey`` is its ``(conflict group, job_id)``, or ``None`` when it can conflict with nothing.
    ``home`` is the key queue holding it (``None`` once admitted or cancelled); a queue entry is
    valid only while the job's ``home`` is that queue, so leaving a queue is O(1) and entries
    left behind are dropped when they reach the front.
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
        "seq",
        "state",
        "tcharge",
        "token",
        "uid",
    )

    def __init__(
        self,
        uid: Hashable,
        lane: Lane,
        job_id: str | None,
        key: KeyState,
        arrival: float,
        seq: int,
        cost: float | None,
        ckey: ConflictKey | None,
    ) -> None:
        self.uid = uid
        self.lane = lane
        self.job_id = job_id
        self.key = key
        self.arrival = arrival
        self.seq = seq
        self.cost = cost
        self.ckey = ckey
        self.home: Any = None  # a fairqueue.KeyQueue, or None
        self.state = JobState.PENDING
        # estimate, charge, token, admitted_at and effective (its effective priority and
        # urgency then) are set at admission and read only after it.
        self.effective: tuple[int, bool]
        self.estimate: float
        self.charge: float
        self.tcharge = 0.0  # what its tenant was charged (two-level keys)
        self.token: int
        self.admitted_at: float

    def order(self) -> Order:
        """The job's place in the dispatch order at the lane agenda's ``now``, smallest first."""
        return self.lane.order(self)

    def __repr__(self) -> str:
        return (
            f"<Job {self.uid!r} {self.lane.type.name}:{self.job_id} "
            f"key={self.key.name!r} {self.state.value}>"
        )


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
    not parked on a held conflict (made by the ``queue`` factory given, a
    ``fairqueue.KeyedQueue``). ``limit``, ``elsewhere`` and ``cap`` as for ``Tier``; a
    ``paused`` type has ``cap`` 0, so a decision skips its lane in O(1) like a full one, and so
    has a type out of its rate (``limited``: its bucket, ``rate`` per second up to ``burst``,
    holds less than a start, core/rates.py); ``halted`` is ``paused or limited``, what even an
    urgent job does not pass. ``aging`` is how its jobs rise (``None``: they do not),
    ``agenda`` the scheduler's, and ``pauses`` the log of the type's pauses (``None`` until
    it is first paused). ``by_key`` says the priority scope is ``"key"`` (``Place``).
    """

    __slots__ = (
        "agenda",
        "aging",
        "burst",
        "by_key",
        "cap",
        "elsewhere",
        "halted",
        "limit",
        "limited",
        "neg_base",
        "paused",
        "pauses",
        "pending",
        "per_cost",
        "queue",
        "rate",
        "running",
        "tier",
        "tokens",
        "tokens_at",
        "two_level",
        "type",
    )

    def __init__(
        self,
        jtype: JobType,
        tier: Tier,
        agenda: Agenda,
        queue: Callable[[Lane], PendingQueue],
        aging: Aging | None = None,
        by_key: bool = False,
        two_level: bool = False,
    ) -> None:
        self.type = jtype
        self.tier = tier
        self.by_key = by_key
        self.two_level = two_level
        cap = UNLIMITED if jtype.max_concurrency is None else jtype.max_concurrency
        self.limit = self.cap = cap
        self.elsewhere = 0
        self.paused = self.limited = self.halted = False
        self.pauses: PauseLog | None = None
        # The type's bucket (core/rates.py), full until a start charges it.
        self.rate = jtype.rate
        self.burst = self.tokens = jtype.bucket
        self.per_cost = jtype.per == "cost"
        self.tokens_at = 0.0
        self.running = 0
        self.pending = 0
        self.neg_base = -tier.priority
        self.agenda = agenda
        self.aging = aging if aging is not None and aging.ages(tier.priority) else None
        self.queue = queue(self)

    def recap(self) -> None:
        """Compute ``halted`` and ``cap`` again: 0 while ``paused`` or ``limited``, else
        ``limit - elsewhere``. O(1)."""
        self.halted = halted = self.paused or self.limited
        self.cap = cap_left(self.limit, self.elsewhere, halted)

    def wait(self, job: Job) -> float:
        """How long ``job`` has waited at the agenda's ``now``, less the time its key, its
        key's tenant or its type was paused since it arrived. O(1) unless one of them was ever
        paused."""
        now = self.agenda.now
        wait = now - job.arrival
        key = job.key
        kp = key.pauses
        tenant = key.tenant
        tp = None if tenant is None else tenant.pauses
        if kp is not None or tp is not None or self.pauses is not None:
            wait -= paused_within((kp, tp, self.pauses), job.arrival, now)
        return wait

    def effective(self, job: Job) -> tuple[int, bool]:
        """``job``'s effective priority now, and whether it has aged into urgency. Short of
        urgency, it rises no higher than its key's ``max_priority``."""
        aging = self.aging
        base = self.tier.priority
        if aging is None:
            return base, False
        level = aging.effective(base, self.wait(job))
        if aging.is_urgent(base, level):
            return level, True
        bound = job.key.max_priority
        if bound is not None and level > bound:
            level = max(base, bound)
        return level, False

    def place(self, job: Job) -> Place:
        """``job``'s ``Place`` now: what its key queue's entry records."""
        key = job.key
        if self.aging is None:
            if self.by_key:
                return (key.rank, key.acc, self.neg_base)
            return (self.neg_base, key.rank, key.acc)
        level, urgent = self.effective(job)
        if urgent:
            return (_NEG_URGENT, 0, 0.0)
        if self.by_key:
            return (key.rank, key.acc, -level)
        return (-level, key.rank, key.acc)

    def order(self, job: Job) -> Order:
        """``job``'s whole place in the order now: its ``place``, widened with its tenant's
        rank and cost with two-level keys, then its arrival and seq."""
        place = self.place(job)
        if self.two_level:
            tenant = job.key.tenant
            assert tenant is not None
            return (*widen(place, tenant.rank, tenant.acc, self.by_key), job.arrival, job.seq)
        return (*place, job.arrival, job.seq)


def widen(place: Place, rank: float, acc: float, by_key: bool) -> tuple[float, ...]:
    """A key's ``place`` with its tenant's ``rank`` and ``acc`` (two-level keys): tenants are
    served fairly first, then keys within the tenant. ``(-level, rank_t, acc_t, rank, acc)``
    with priority scope ``"global"``, ``(rank_t, acc_t, rank, acc, -level)`` with ``"key"``;
    an urgent place stays first in both, ``(-URGENT, 0, 0, 0, 0)``."""
    p0 = place[0]
    if p0 == _NEG_URGENT:
        return (p0, 0, 0.0, 0, 0.0)
    if by_key:
        return (rank, acc, p0, place[1], place[2])
    return (p0, rank, acc, place[1], place[2])


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
    counts, its cap and what runs elsewhere, its pause, its rate's bucket) is not the side
    lane's own: every one of those attributes reads and writes ``home``, the type's lane, so
    the type's cap and rate span all its lanes and a pause stops them all. A type without such
    jobs has no side lane, and the type's own lane pays nothing for them.
    """

    __slots__ = ("home",)

    running = _forwarded("running")
    pending = _forwarded("pending")
    limit = _forwarded("limit")
    elsewhere = _forwarded("elsewhere")
    cap = _forwarded("cap")
    paused = _forwarded("paused")
    pauses = _forwarded("pauses")
    limited = _forwarded("limited")
    halted = _forwarded("halted")
    rate = _forwarded("rate")
    burst = _forwarded("burst")
    per_cost = _forwarded("per_cost")
    tokens = _forwarded("tokens")
    tokens_at = _forwarded("tokens_at")

    def __init__(
        self,
        home: Lane,
        tier: Tier,
        queue: Callable[[Lane], PendingQueue],
        aging: Aging | None,
    ) -> None:
        # Not Lane.__init__: that would reset the type's counts through the forwarded names.
        self.home = home
        self.type = home.type
        self.tier = tier
        self.by_key = home.by_key
        self.two_level = home.two_level
        self.neg_base = -tier.priority
        self.agenda = home.agenda
        self.aging = aging if aging is not None and aging.ages(tier.priority) else None
        self.queue = queue(self)


class Conflict:
    """One ``(conflict group, job_id)`` that is held or waited for.

    It exists in ``registry`` (the scheduler's) exactly while a job holds it or a conflict
    lane waits on it, so the many jobs whose ids never meet cost no conflict object at all.
    ``holder`` is the running job that holds it, if any, or ``ELSEWHERE`` while only a job on
    another worker does; ``elsewhere`` says a shared store reported it held by another worker
    (it stays held after a local holder is released, until the store says it is free);
    ``lanes`` maps each lane to the conflict lane of jobs parked there. Parking a
    job on it and releasing it are the index's (``fairqueue.park_on``, ``fairqueue.release``).
    """

    __slots__ = ("elsewhere", "holder", "key", "lanes", "registry")

    def __init__(self, key: ConflictKey, registry: dict[ConflictKey, Conflict]) -> None:
        self.key = key
        self.registry = registry
        self.holder: Job | None = None
        self.elsewhere = False
        self.lanes: dict[Lane, Any] = {}  # each a fairqueue.ConflictLane

    def forget_if_idle(self) -> None:
        """Leave the registry once nobody holds or waits for this conflict."""
        if self.holder is None and not self.lanes and self.registry.get(self.key) is self:
            del self.registry[self.key]

    def __repr__(self) -> str:
        return f"<Conflict {self.key[0]}:{self.key[1]} holder={self.holder!r}>"


class _Elsewhere(Job):
    """The holder of a conflict that only a job on another worker holds."""

    __slots__ = ()

    def __init__(self) -> None:
        pass

    def __repr__(self) -> str:
        return "<held elsewhere>"


ELSEWHERE: Job = _Elsewhere()
"""``Conflict.holder`` while a job of another worker, and none of ours, holds the conflict."""
