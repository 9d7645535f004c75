"""The shared-state contract: what every store does, in the values it takes and returns.

A store is the authority over the state that a fleet of workers shares: running jobs per tier
and per type, conflict holds, accumulated costs per fairness key, learned estimates per
``(type, job_id)``, and which worker runs what under which lease. Pending jobs are not in it:
each worker holds its own messages and orders them with the core; the store only says yes or
no to the job the worker would start next, atomically for everyone.

Every operation is a batch, so that one call is one round trip whatever its size.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection
from typing import NamedTuple, Protocol

from ..core.lanes import LaneMap
from ..core.types import BlockReason
from ..errors import ConfigurationError

__all__ = [
    "REFUSAL_REASONS",
    "SCHEMA",
    "Ask",
    "Done",
    "Finished",
    "Grant",
    "Holder",
    "Queued",
    "QueuedCount",
    "Registered",
    "Reply",
    "Running",
    "Store",
    "Submission",
    "Tracked",
    "Verdict",
    "View",
    "check_lane_seconds",
    "conflict_field",
    "conflict_of",
    "estimate_field",
    "lane_sweep",
    "parse_queued_member",
    "queued_member",
    "rate_after",
    "service_rate",
    "submission_field",
]

SCHEMA = "5"
"""The version of the shared layout. A store holding another version refuses to work."""


def estimate_field(type: str, job_id: str | None) -> str:
    """The name under which ``(type, job_id)``'s estimate is stored; unambiguous for any strings.

    >>> estimate_field("clone", "linux"), estimate_field("clone", None)
    ('5:clone=linux', '5:clone')
    """
    head = f"{len(type)}:{type}"
    return head if job_id is None else f"{head}={job_id}"


def conflict_field(group: str, job_id: str | None) -> str:
    """The name of the conflict ``(group, job_id)``, or ``""`` for a job that has none.

    >>> conflict_field("git", "linux"), conflict_field("", "linux"), conflict_field("git", None)
    ('3:gitlinux', '', '')
    """
    if not group or job_id is None:
        return ""
    return f"{len(group)}:{group}{job_id}"


def submission_field(fairness_key: str, idempotency_key: str) -> str:
    """The name under which a submission's idempotency key is recorded; unambiguous.

    >>> submission_field("alice", "order-17")
    '5:aliceorder-17'
    """
    return f"{len(fairness_key)}:{fairness_key}{idempotency_key}"


def conflict_of(field: str) -> tuple[str, str] | None:
    """The ``(group, job_id)`` a ``conflict_field`` names; ``None`` for ``""`` or a malformed one.

    >>> conflict_of("3:gitlinux"), conflict_of("")
    (('git', 'linux'), None)
    """
    size, sep, rest = field.partition(":")
    if not sep or not size.isdigit() or int(size) > len(rest):
        return None
    return rest[: int(size)], rest[int(size) :]


def queued_member(fairness_key: str, at: float, task_id: str) -> str:
    """A tracked submission's entry in the store's index by key (``{prefix}:queued_by_key``,
    a sorted set read by lexical ranges): the key with its length in bytes first (so no key is a
    prefix of another's entries), then the time in a fixed width (so a key's entries sort by
    it), then the task id. The Lua side (``lua/queued.lua``) reads the key back the same way.

    >>> queued_member("alice", 1700000000.25, "t1")
    '5:alice|00001700000000.250000|t1'
    """
    return f"{len(fairness_key.encode())}:{fairness_key}|{at:021.6f}|{task_id}"


def parse_queued_member(member: str) -> Tracked:
    """A ``queued_member`` read back.

    >>> parse_queued_member(queued_member("a|b", 1700000000.25, "t1"))
    Tracked(task_id='t1', fairness_key='a|b', at=1700000000.25)
    """
    size, _, rest = member.partition(":")
    raw = rest.encode()
    n = int(size)
    key = raw[:n].decode()
    at, _, task_id = raw[n + 1 :].decode().partition("|")
    return Tracked(task_id, key, float(at))


def check_lane_seconds(seconds: float) -> float:
    """``fair_lane_seconds`` (a lane assignment's lease), checked for a store's constructor.

    Raises:
        ConfigurationError: It is not a positive number.
    """
    if isinstance(seconds, bool) or not (isinstance(seconds, (int, float)) and seconds > 0):
        raise ConfigurationError(f"fair_lane_seconds must be a positive number, got {seconds!r}")
    return float(seconds)


def lane_sweep(
    size: int, looked: Collection[int], empty: Collection[int]
) -> tuple[list[int], list[int]]:
    """A lane sweep's lanes as both stores take them (``Store.sweep_lanes``): those looked at,
    in order and each once, and those among them found empty (a lane not looked at tells
    nothing), so a lane named twice counts once in either store.

    >>> lane_sweep(4, [2, 0, 2], [2, 5])
    ([0, 2], [2])

    Raises:
        ValueError: ``size`` or a lane is not an integer >= 0.
    """
    for what, value in (("size", size), *(("lane", lane) for lane in (*looked, *empty))):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"sweep_lanes: {what}: expected an integer >= 0, got {value!r}")
    seen = sorted(set(looked))
    found = set(empty)
    return seen, [lane for lane in seen if lane in found]


class Submission(NamedTuple):
    """The record of an idempotent submission another producer made first."""

    task_id: str
    published: bool  # False: its producer has not published it yet (or may have failed to)


class QueuedCount(NamedTuple):
    """What ``track`` found: the key's tracked jobs and all of them, before this one."""

    added: bool  # False: refused by a limit (nothing recorded), or already tracked
    in_key: int
    total: int
    refused_by: str = ""  # "key" or "total" when a limit refused it


class Tracked(NamedTuple):
    """One tracked submission, as ``Store.tracked`` lists it."""

    task_id: str
    fairness_key: str
    at: float  # when it was tracked (the store's clock)


class Queued(NamedTuple):
    """A tracked submission: submitted and not yet ended (in the broker, held or running)."""

    fairness_key: str
    at: float  # when it was tracked (the store's clock)
    place_in_key: int  # 1 = its key's oldest
    in_key: int
    place: int  # among every tracked job, by time; 1 = the oldest
    total: int
    rate: float = 0.0  # its key's tracked jobs ended per second lately (0: not known yet)

    @property
    def expected_wait(self) -> float | None:
        """Seconds until it is expected to start: its key's jobs ahead of it, at the pace its
        key's jobs end (``rate``); ``None`` while that pace is not known. Since the jobs ahead
        include the key's running ones, it errs late by about one job's time for each slot
        the key holds beyond the first (docs/operations.md gives the error measured)."""
        return (self.place_in_key - 1) / self.rate if self.rate > 0 else None


RATE_WINDOW = 60.0
"""Seconds of a key's ends that its service rate (``Queued.rate``) looks back over."""


def rate_after(
    record: tuple[float, float, float] | None, ended: int, now: float
) -> tuple[float, float, float]:
    """A key's record of tracked jobs ended, ``(n, since, last)``: ``n`` ended between
    ``since`` and ``last``, after ``ended`` more at ``now``. A gap of ``RATE_WINDOW`` without
    ends starts it over; past ``RATE_WINDOW`` it keeps the last half window's share of ``n``.
    ``lua/queued.lua`` (``rate_after``) keeps the same record the same way."""
    if record is None or now - record[2] > RATE_WINDOW:
        return (float(ended), now, now)
    n, since, _ = record
    n += ended
    if now - since > RATE_WINDOW:
        n = n * (RATE_WINDOW / 2) / (now - since)
        since = now - RATE_WINDOW / 2
    return (n, since, now)


def service_rate(record: tuple[float, float, float] | None, now: float) -> float:
    """Ends per second by ``record`` (``rate_after``) at ``now``: the ends after the first over
    the time since it, so a pause in the ends lowers it. 0.0 until two ends a second apart
    or more, and after a window without any. (The Lua computes it the same way.)"""
    if record is None:
        return 0.0
    n, since, last = record
    if n < 2 or now - since < 1.0 or now - last > RATE_WINDOW:
        return 0.0
    return (n - 1) / (now - since)


class Holder(NamedTuple):
    """The job that holds a conflict, fleet-wide (job control's explain)."""

    uid: str  # its uid (its task id, for a job that was not retried or replaced)
    worker: str  # the store's name of its worker ("" if unknown)
    held_for: float | None  # seconds since its admission, by the store's clock


class Verdict(str, enum.Enum):
    """What the store said to one job it was asked to admit."""

    ADMITTED = "ok"
    TIER_CAP = "tier"  # its tier runs as many jobs as its cap, fleet-wide
    TYPE_CAP = "type"  # its type runs max_concurrency jobs, fleet-wide
    KEY_CAP = "key"  # its fairness key runs its max_concurrency jobs, fleet-wide
    TENANT_CAP = "tenant"  # its key's tenant runs its max_concurrency jobs over all its keys
    RATE_LIMIT = "rate"  # its fairness key's bucket holds less than a start (core/rates.py)
    CONFLICT = "conflict"  # another job, on any worker, holds its conflict
    PAUSED = "paused"  # its fairness key or its type is paused fleet-wide (runtime policies)
    RUNNING = "running"  # a job with this uid runs now, on a live lease (a copy of its message)
    DONE = "done"  # a job with this uid finished for good recently (a late copy of its message)
    RECOVERING = "recovering"  # the store came back empty; workers are re-registering


#: What each refusal is called in the metrics and the observer (``refused_total{reason}``):
#: the core's ``BlockReason`` spelling where the core has the same rule, one word otherwise.
#: Every verdict but ``ADMITTED`` and the two about copies of a message (``RUNNING``,
#: ``DONE``, counted apart) is here, so a new refusal cannot go uncounted.
REFUSAL_REASONS: dict[Verdict, str] = {
    Verdict.TIER_CAP: BlockReason.TIER_CAP.value,
    Verdict.TYPE_CAP: BlockReason.TYPE_CAP.value,
    Verdict.KEY_CAP: BlockReason.KEY_CAP.value,
    Verdict.TENANT_CAP: BlockReason.TENANT_CAP.value,
    Verdict.RATE_LIMIT: BlockReason.RATE_LIMIT.value,
    Verdict.CONFLICT: BlockReason.CONFLICT.value,
    Verdict.PAUSED: "paused",
    Verdict.RECOVERING: "recovering",
}


class Ask(NamedTuple):
    """One pending job a worker would like to start now."""

    uid: str  # unique per job: the Celery task id
    type: str
    priority: int
    tier_cap: int | None  # None: no cap
    type_cap: int | None
    conflict: str  # conflict_field(group, job_id)
    estimate_key: str  # estimate_field(type, job_id)
    fairness_key: str
    cost: float | None  # charge this instead of the learned estimate
    default_cost: float
    key_cap: int | None = None  # the fairness key's max_concurrency (None: no cap)
    weight: float = 1.0  # the key is charged estimate / weight
    # An urgent job's claim (docs/design.md 5e): refused for a full tier or type cap, it
    # holds the next slot of that cap that frees for this many seconds, renewed by each
    # ask; other jobs see the slot taken. None: no claim (a job that is not urgent).
    claim: float | None = None
    # The fairness key's rate (per second; None: none), its bucket's size, and whether a start
    # charges the bucket its estimate (else 1): core/rates.py, the one rule of both stores.
    rate: float | None = None
    burst: float = 1.0
    per_cost: bool = False
    # The job type's rate, as the key's: one bucket for the type's jobs of every key.
    type_rate: float | None = None
    type_burst: float = 1.0
    type_per_cost: bool = False
    # Two-level keys (core/tenants.py): the key's tenant (None: flat keys), charged estimate /
    # tenant_weight beside the key, and its cap over all its keys' running jobs (None: none).
    tenant: str | None = None
    tenant_weight: float = 1.0
    tenant_cap: int | None = None
    # The tenant's rate, as the key's: one bucket for the starts of all the tenant's keys.
    tenant_rate: float | None = None
    tenant_burst: float = 1.0
    tenant_per_cost: bool = False


class Grant(NamedTuple):
    """The store's answer to one ``Ask``."""

    uid: str
    verdict: Verdict
    token: int  # the fencing token when admitted, else 0
    estimate: float | None  # the estimate when admitted (the key was charged estimate / weight)
    accumulated: float  # the key's accumulated cost, fleet-wide, after this decision
    tokens: float | None = None  # the key's bucket after this decision (None: no rate)
    type_tokens: float | None = None  # the type's bucket after it (None: no rate)
    # The tenant's accumulated cost, fleet-wide, after it (None: the ask named no tenant).
    tenant_accumulated: float | None = None
    tenant_tokens: float | None = None  # the tenant's bucket after it (None: no rate)


class Done(NamedTuple):
    """A running job that ended: ``elapsed`` seconds to learn from, or ``None`` to only release.

    ``final`` says its message was acknowledged, so the broker will not deliver it again: the
    store then remembers the uid for a while (``dedupe`` seconds) and answers ``DONE`` to a
    copy that was already on its way. ``unstarted`` says the job never began (it was admitted
    and then given back): the cost it was charged at admission is refunded to its key.
    """

    uid: str
    token: int
    elapsed: float | None
    final: bool = False
    unstarted: bool = False


class Finished(NamedTuple):
    """What a ``Done`` changed: ``applied`` is false for a stale token (nothing changed)."""

    uid: str
    applied: bool
    estimate: float | None  # the estimate after learning, when applied


class Reply(NamedTuple):
    """The answer to one ``admit`` call, with the fleet-wide state after it.

    Attributes:
        finished: One per ``Done`` given, in order (they are applied before any ``Ask``).
        grants: One per ``Ask``, in order.
        tiers, types: Running jobs per priority and per type, fleet-wide, this worker's included,
            plus one for each slot an urgent job's live claim holds (``Ask.claim``).
        held: For each watched conflict field, whether some job holds it now.
        workers: Workers holding a live lease (this one included).
        keys: Running jobs, fleet-wide, of each fairness key asked for with a ``key_cap``.
        tenants: Running jobs, fleet-wide, of each tenant asked for with a ``tenant_cap``.
    """

    epoch: str
    finished: list[Finished]
    grants: list[Grant]
    tiers: dict[int, int]
    types: dict[str, int]
    held: dict[str, bool]
    workers: int
    keys: dict[str, int]
    tenants: dict[str, int] = {}  # noqa: RUF012 (a NamedTuple's default, never mutated)


class Running(NamedTuple):
    """A job a worker is running, as it re-registers it with a store that lost it."""

    uid: str
    token: int
    type: str
    priority: int
    conflict: str
    estimate_key: str
    fairness_key: str
    estimate: float  # what its key was charged (refunded if it is given back unstarted)
    default_cost: float
    tenant: str | None = None  # its key's tenant (two-level keys), and what it was charged
    tenant_charge: float = 0.0


class Registered(NamedTuple):
    """What a ``register`` changed: jobs put back, and (when the caller listed every job it
    has) jobs the store counted under it that it does not run, released."""

    registered: int
    released: int


class View(NamedTuple):
    """What a heartbeat reads: enough for a worker to order its held jobs and wake them."""

    epoch: str
    now: float
    mine: int  # this worker's running jobs that the store knows
    reclaimed: int  # jobs of dead workers released by this heartbeat
    tiers: dict[int, int]
    types: dict[str, int]
    held: dict[str, bool]  # per asked conflict field
    accumulated: dict[str, float]  # per asked fairness key
    workers: int  # workers holding a live lease (this one included)
    keys: dict[str, int]  # running jobs, fleet-wide, per asked fairness key that runs any
    policies: int = 0  # the runtime policies' version (0: never set)
    policy_doc: str | None = None  # their document, when the caller had another version
    tenant_accumulated: dict[str, float] = {}  # noqa: RUF012 per asked tenant (two levels)
    tenants: dict[str, int] = {}  # noqa: RUF012 running jobs per asked tenant that runs any


PolicyChange = Callable[[str], tuple[str, Collection[str], Collection[str], Collection[str]]]
"""The runtime policies' document in, the new one out with its paused keys, types and tenants
(two-level keys)."""


class Store(Protocol):
    """Shared state for one scheduler, in memory or in Redis; see docs/store.md."""

    epoch: str  # the store's identity, as last seen ("" before the first call)

    def admit(
        self,
        worker: str,
        asks: list[Ask],
        done: list[Done] | None = None,
        watch: list[str] | None = None,
    ) -> Reply:
        """Release ``done`` (as ``finish``), then try each job in order and admit those that fit;
        report whether each ``watch`` conflict is held. One round trip.

        Each ask gets the first of these verdicts that applies, checked in this order (the one
        statement of it: ``MemoryStore.admit`` and ``lua/admit.lua`` follow it):

        1. ``RECOVERING``: the store came back empty and workers are re-registering (a store
           that never restarts, as ``MemoryStore``, never says it).
        2. ``RUNNING``: a job with its uid is running.
        3. ``DONE``: a job with its uid finished for good (``Done.final``) within the dedupe
           window (never with a dedupe window of 0).
        4. ``PAUSED``: its fairness key, its type or its tenant is paused
           (``update_policies``).
        5. ``TIER_CAP``: its tier runs ``tier_cap`` jobs, a slot that another job's claim holds
           counted as running. An urgent ask (``claim``) refused here claims the tier's next
           free slot, unless another job's claim holds it.
        6. ``TYPE_CAP``: its type runs ``type_cap`` jobs, as for the tier (claims included).
        7. ``KEY_CAP``: its fairness key runs ``key_cap`` jobs; ``TENANT_CAP``: its tenant
           (two-level keys) runs ``tenant_cap`` over all its keys.
        8. ``RATE_LIMIT``: its fairness key has a ``rate`` and its bucket, refilled to now,
           holds less than a start (core/rates.py); or so does its type's (``type_rate``),
           or its tenant's (``tenant_rate``).
        9. ``CONFLICT``: another job holds its conflict.
        10. Otherwise ``ADMITTED``: it runs, counted at once for the asks after it, and a key
            with a ``rate`` has its bucket charged 1, or its estimate with ``per_cost``, and a
            type with a ``type_rate`` and a tenant with a ``tenant_rate`` their own likewise.

        Each grant carries its key's bucket level after it (``Grant.tokens``) when the ask
        has a ``rate``, and likewise its type's (``type_tokens``) and its tenant's
        (``tenant_tokens``). A key or tenant whose cost expires (``cost_ttl``) forgets its
        bucket with it; a job given back unstarted (``Done.unstarted``) refunds each bucket
        what its admission charged.

        With a ``tenant``, an admitted job also charges the tenant ``estimate /
        tenant_weight``, and counts as running for it until it ends. A tenant's cost follows
        a key's lifecycle: forgotten ``cost_ttl`` after its last running job ended, reset with
        the keys', and with ``advance_idle`` a tenant that starts a job with none running
        starts from the least active tenant's cost, and a key from the least active key's of
        its tenant. Each grant of an ask with a tenant carries the tenant's cost after it
        (``Grant.tenant_accumulated``).

        A refused ask does not stop the ones after it.
        """
        ...

    def finish(self, worker: str, done: list[Done]) -> list[Finished]:
        """Release jobs (learning from their wall time), each fenced by its token."""
        ...

    def heartbeat(
        self,
        worker: str,
        conflicts: list[str],
        keys: list[str],
        policies: int = -1,
        tenants: list[str] | None = None,
    ) -> View:
        """Renew the worker's lease, reclaim dead workers' jobs, read what the worker needs
        (with ``tenants``, their accumulated costs and running jobs too)."""
        ...

    def register(
        self, worker: str, jobs: list[Running], keep: list[str] | None = None
    ) -> Registered:
        """Put back running jobs the store forgot.

        With ``keep`` (the uids of the jobs that ended and whose end is not reported yet),
        ``jobs`` and ``keep`` are all the worker has: any other job the store counts under it
        is released (a release that a failover lost, say).
        """
        ...

    def policies(self) -> tuple[int, str]:
        """The runtime policies' version (0: never set) and document (``""`` if none)."""
        ...

    def update_policies(self, change: PolicyChange) -> tuple[int, str]:
        """Replace the runtime policies' document by ``change(document)``'s, atomically, with
        the paused keys, types and tenants it returns (which ``admit`` refuses,
        ``Verdict.PAUSED``: a tenant's, any ask that names it as its ``tenant``);
        the version goes up by one. Returns the new version and document."""
        ...

    def claim_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> Submission | None:
        """Record ``task_id`` as the *pending* submission of ``(fairness_key,
        idempotency_key)`` for ``seconds`` (its producer is about to publish it), atomically for
        every producer: ``None`` if it now is, else the submission recorded first, published
        (``confirm_submission``) or still pending. A pending record lapses after ``seconds``;
        a published one after its own time."""
        ...

    def confirm_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> bool:
        """``task_id`` was published: its pending record is dropped and ``task_id`` becomes the
        published record of ``(fairness_key, idempotency_key)``, kept ``seconds``, unless one
        is recorded already (the first published stays). ``False`` if its pending record was
        gone (it lapsed, so another submit may have published too)."""
        ...

    def forget_submission(self, fairness_key: str, idempotency_key: str, task_id: str) -> None:
        """Drop ``task_id``'s pending record of ``(fairness_key, idempotency_key)`` if it is
        still its own (its publish failed or was refused, so a later submit may publish)."""
        ...

    def track(
        self,
        fairness_key: str,
        task_id: str,
        *,
        key_limit: int | None = None,
        total_limit: int | None = None,
        seconds: float = 86400.0,
    ) -> QueuedCount:
        """Record ``task_id`` as submitted by ``fairness_key`` (``fair_track_submits``), unless
        the key already has ``key_limit`` tracked jobs or the store ``total_limit``: then it
        records nothing (``refused_by``). Atomic for every producer. Entries older than
        ``seconds`` are dropped as they are met (a job whose end was never reported)."""
        ...

    def untrack(self, task_ids: Collection[str], *, ended: bool = True) -> int:
        """Forget these submissions (they ended: done, failed, revoked, dead-lettered);
        returns how many were tracked. ``ended=False``: they never were (their publish failed),
        so their keys' rates of ends (``Queued.rate``) do not count them. One round trip."""
        ...

    def queued(self, task_id: str) -> Queued | None:
        """Where ``task_id`` stands among the tracked submissions, or ``None``. O(log n)."""
        ...

    def tracked(
        self, fairness_key: str | None = None, limit: int = 100
    ) -> tuple[list[Tracked], int]:
        """The ``limit`` oldest tracked submissions of ``fairness_key`` (``None``: of every
        key), oldest first, and how many there are in all. One round trip; O(log n + limit)."""
        ...

    def holder(self, conflict: str) -> Holder | None:
        """Who holds ``conflict`` (a ``conflict_field``), or ``None``. Reads only; O(1)."""
        ...

    # -- lanes: a queue of its own for each heavy fairness key (core/lanes.py; docs/design.md
    # section 5f). The store keeps the fleet's one ``LaneTable``, at the store's time, with the
    # lease the store was made with (``lane_seconds``) and core/lanes.py's ``GRACE`` and
    # ``EMPTY_SWEEPS``. ``MemoryStore`` uses ``LaneTable`` itself, ``lua/lanes.lua`` states the
    # same rule (tests/store/test_lanes_agree.py checks that the two answer alike).

    def lanes(self, version: int) -> LaneMap | None:
        """The fleet's lane map (the keys routed to a lane now, and the table's version), or
        ``None`` if the table's version is ``version``: the caller's copy is current. Versions
        never repeat, not even in a store that came back empty (wire.py,
        ``first_lane_version``), so compare them for inequality only. One round trip; O(1)
        while unchanged, O(assignments) otherwise."""
        ...

    def ask_lane(self, fairness_key: str) -> int | None:
        """``fairness_key`` turned heavy: its lane (``LaneTable.ask`` now: the one it has,
        renewed, else the lane with the fewest keys), or ``None`` while the fleet agrees on no
        lanes (``sweep_lanes``). One round trip; O(agreed size) for a new key, else O(1)."""
        ...

    def renew_lanes(self, fairness_keys: Collection[str]) -> None:
        """These keys are still heavy: their assignments' leases run from now
        (``LaneTable.renew``; a key without a lane, or leaving it, is left as it is). One
        round trip; O(keys given)."""
        ...

    def sweep_lanes(
        self, worker: str, size: int, looked: Collection[int], empty: Collection[int]
    ) -> None:
        """One worker's look at the lanes (each worker's sweep makes one, about every second).
        In this order:

        1. ``worker`` consumes ``size`` lanes: its announcement, kept while it lives.
        2. The live workers are those whose lease has not expired, and ``worker`` itself (it
           calls now, so it consumes its lanes now, before its first heartbeat too). The
           announcements of the others are forgotten: a worker whose lease lapsed must
           announce again before it counts.
        3. The fleet agrees on ``core.lanes.agreed_size`` of ``core.lanes.fleet_sizes``: the
           live workers' announcements, and none once a live worker has gone
           ``ANNOUNCE_GRACE`` seconds without one (an older release, which consumes no lanes;
           a worker that just started has not announced yet, and is left out until then);
           when that changed, ``LaneTable.resize``.
        4. ``LaneTable.sweep(empty, looked, now)`` (lanes as ``lane_sweep`` takes them).

        One round trip; O(assignments + live workers).

        Raises:
            ValueError: ``size`` or a lane is not an integer >= 0 (nothing is recorded).
        """
        ...

    def estimate(self, type: str, job_id: str | None, default: float) -> float:
        """The learned estimate, or ``default`` (inspection and tests)."""
        ...

    def accumulated_cost(self, fairness_key: str) -> float:
        """The key's accumulated cost, 0 if unknown (inspection and tests)."""
        ...

    def close(self) -> None: ...
