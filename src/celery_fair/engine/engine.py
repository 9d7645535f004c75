"""The engine: a worker's core and the fleet's store, composed (the package docstring says how)."""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from ..core import (
    Admission,
    CancelOutcome,
    Clock,
    JobType,
    MonotonicClock,
    PriorityOutcome,
    Scheduler,
)
from ..core.types import check_priority
from ..errors import ConfigurationError, DuplicateJob, UnknownJob
from ..observe import Counters, Observer
from ..runtime_policies import RuntimePolicies, apply_to
from ..store.base import (
    Ask,
    Done,
    Registered,
    Reply,
    Running,
    Store,
    View,
    conflict_field,
    estimate_field,
)
from ..store.wire import lease_held_for
from . import replies
from . import reserved as reserved_jobs
from .calls import NOTHING, AdmitCall, BeatCall, Call, Decision, RegisterCall
from .driver import Driver
from .fleet import FleetMirror
from .modes import Event, Mode, State, Sync
from .outage import OUTAGE_POLICIES, Outage
from .reserved import Vetted

__all__ = ["OUTAGE_POLICIES", "Engine", "Mode", "Vetted"]

logger = logging.getLogger(__name__)

#: The shortest gap, in seconds, between two looks at the store for jobs that wait on other
#: workers (``Engine._poll_gap``): at most 50 a second per worker, and only while they wait.
MIN_POLL = 0.02


@dataclass(slots=True)
class _Tracked:
    """The engine's record of one job it tracks from ``submit`` until it is finished or cancelled
    (pending, stalled or running): what it asks the store for it, and what the store answered."""

    ask: Ask
    group: str
    job_id: str | None
    arrival: float
    cost: float | None
    priority: int | None = None  # its own, if not its type's
    token: int = 0
    estimate: float = 0.0
    in_store: bool = False  # the store counts it as running under this worker
    cancelled: bool = False  # withdrawn while its admission was in flight
    stalled: bool = False  # its uid was found running elsewhere at least once
    term: int = 0  # the engine's lease term when the store admitted (or registered) it


def _charged(job: _Tracked) -> float:
    """What ``job``'s key was charged at its admission: its estimate over the key's weight."""
    weight = job.ask.weight
    return job.estimate if weight == 1.0 else job.estimate / weight


def _tenant_charged(job: _Tracked) -> float:
    """What ``job``'s tenant was charged at its admission (two-level keys; 0 without)."""
    ask = job.ask
    if ask.tenant is None:
        return 0.0
    weight = ask.tenant_weight
    return job.estimate if weight == 1.0 else job.estimate / weight


def _rate_changes(ask: Ask, prefix: str, terms: tuple[float, float, bool] | None) -> dict[str, Any]:
    """The fields of ``ask`` to change for its rate terms (``prefix`` ``""``: its key's,
    ``"tenant_"``: its tenant's) to be ``terms`` (``None``: no rate); none when they are."""
    if terms is None:
        return {} if getattr(ask, f"{prefix}rate") is None else {f"{prefix}rate": None}
    names = (f"{prefix}rate", f"{prefix}burst", f"{prefix}per_cost")
    if terms == tuple(getattr(ask, name) for name in names):
        return {}
    return dict(zip(names, terms, strict=True))


class Engine:
    """A worker's core and the fleet's store, composed (see the module docstring).

    Args:
        scheduler: The core, with every job type registered.
        store: The shared store, or ``None`` to decide alone.
        worker: This worker's identity in the store; unique per process start.
        outage: ``"hold"`` or ``"local"``: what to do while the store is unreachable.
        poll_interval: Seconds between two looks at the store while jobs here wait only for
            what other workers run or hold, and between two retries of a job whose uid runs
            elsewhere or of an urgent job that holds a claim on a full tier or type.
        clock: The engine's own clock for intervals (monotonic by default).
        observer: Told of admissions refused, store calls, outages (observe.py); a
            ``Counters`` of its own by default.
    """

    def __init__(
        self,
        scheduler: Scheduler,
        store: Store | None = None,
        *,
        worker: str = "worker",
        outage: str = "hold",
        poll_interval: float = 0.5,
        clock: Clock | None = None,
        observer: Observer | None = None,
    ) -> None:
        if outage not in OUTAGE_POLICIES:
            raise ValueError(f"outage must be one of {OUTAGE_POLICIES}, got {outage!r}")
        self.core = scheduler
        self.store = store
        self.worker = worker
        self.outage = outage
        self.poll_interval = poll_interval
        self.clock: Clock = clock or MonotonicClock()
        # The mode and the syncs owed to the store, moved only along modes.TABLE.
        self.state = State(Mode.ALONE if store is None else Mode.SHARED, Mode(outage))
        # While the store is unreachable: the probe's backoff, local holds and tokens.
        self._degraded = Outage()
        lease = float(getattr(store, "lease", 30.0))
        # A beat renews the lease (admissions do too, once a quarter lease has passed),
        # refreshes the costs of the keys held here, which other workers charge too, and
        # brings a change of the runtime policies: at least every second, thrice per lease.
        self.beat_interval = min(lease / 3, 1.0)
        # The runtime policies (policies.py) as of the last beat; -1: not read yet. Until the
        # first beat brings them the store still refuses a paused job (Verdict.PAUSED), and
        # such a refusal makes the next call a beat.
        self._policy_version = -1
        self._configured_keys = scheduler.key_policies
        self.runtime_policies = RuntimePolicies()
        self.epoch = ""
        self.observer = observer if observer is not None else Counters()
        # foreground: every job here has a caller waiting in its own process (slots.py). Like
        # an urgent job, refused for a full tier or type it claims the cap's next free slot,
        # so a worker's held backlog of that type cannot take every slot that frees first.
        self.foreground = False
        # _jobs: every job given to submit() and not yet finished or cancelled, by uid.
        self._jobs: dict[Hashable, _Tracked] = {}
        # _done: finished jobs the store has not been told about yet (it still counts them as
        # running under this worker), oldest first, each with its record.
        self._done: list[tuple[Done, _Tracked]] = []
        # _stalled: jobs whose uid runs elsewhere, or urgent jobs refused for a full shared cap
        # (the store holds its next free slot for them), withdrawn from the core until this
        # time, when they are asked for again.
        self._stalled: dict[Hashable, float] = {}
        # _fleet: what the store last said of the fleet, and what it counts as this worker's:
        # the jobs with ``in_store`` set, plus the finished ones in _done and in the call in
        # flight (the store has not heard of their end yet).
        self._fleet = FleetMirror()
        self._inflight: Call | None = None
        # run_inline's driver, and what it gathers: everything to start and drop.
        self._inline = Driver(self, self._gather)
        self._gathered = NOTHING
        now = self.clock.now()
        self._beat_due = now
        self._poll_due = now
        self._pause_until = now
        self._max_token = 0
        # _contact: when the last store call that succeeded was sent. _term counts the times
        # the lease may have lapsed: a successful call sent lease_held_for(lease) or more after
        # the one before it starts a new term. A job admitted in an earlier term, or while the
        # last contact is that old, may have lost its admission (``vet``).
        self.lease = lease
        self._held_for = lease_held_for(lease)
        self._contact = -math.inf
        self._term = 0

    # -- events in -------------------------------------------------------------------------

    def submit(
        self,
        uid: Hashable,
        type: str,
        job_id: str | None,
        fairness_key: str,
        *,
        arrival: float,
        cost: float | None = None,
        priority: int | None = None,
    ) -> None:
        """A job to schedule. ``uid`` is its identity (the store knows it as ``str(uid)``);
        ``priority`` is its own if not its type's (``Scheduler.submit``). A job above its
        key's ``max_priority`` is lowered to it, and the observer told (``priority_lowered``).

        A job cancelled while its admission was in flight may be submitted again (its message
        came back): the new submission takes over that admission.

        Raises:
            DuplicateJob: ``uid`` is already pending, stalled or running here.
        """
        known = self._jobs.get(uid)
        if known is not None and known.cancelled:
            known.cancelled = False
            return
        if uid in self._stalled:
            raise DuplicateJob(f"job {uid!r} is already held by the engine")
        core = self.core
        own = core.priority_for(type, fairness_key, priority)
        if own != priority:
            self.observer.priority_lowered(type)
            priority = own
        core.submit(uid, type, job_id, fairness_key, arrival=arrival, cost=cost, priority=priority)
        if self.store is None:
            return
        jtype = core.type_of(type)
        ask = self._ask(uid, jtype, job_id, fairness_key, cost, priority)
        job = self._jobs[uid] = _Tracked(ask, jtype.conflict_group, job_id, arrival, cost, priority)
        if self.state.mode is Mode.LOCAL:
            self._degraded.hold(core, job.group, job_id)

    def cancel(self, uid: Hashable) -> bool:
        """Withdraw a job that has not started; ``False`` if it runs (or is about to)."""
        job = self._jobs.get(uid)
        if self._stalled.pop(uid, None) is not None:
            del self._jobs[uid]
            return True
        outcome = self.core.cancel(uid)
        if outcome is CancelOutcome.RUNNING:
            if job is not None and self._is_in_flight(uid):
                job.cancelled = True  # released as soon as the store answers
                return True
            return False
        self._jobs.pop(uid, None)
        return outcome is CancelOutcome.CANCELLED

    def reprioritize(self, uid: Hashable, priority: int | None) -> PriorityOutcome:
        """Give a job that has not started the priority ``priority`` (``None``: its type's):
        ``Scheduler.reprioritize``, which also restarts its wait. A job withdrawn from the core
        until it is asked for again (its uid runs elsewhere, or it claims a full cap) takes
        the new priority when it is. ``RUNNING`` for a job admitted, its admission in flight
        included. O(log n)."""
        check_priority(priority)
        job = self._jobs.get(uid)
        core = self.core
        outcome = PriorityOutcome.OK if uid in self._stalled else core.reprioritize(uid, priority)
        if outcome is PriorityOutcome.OK and job is not None:
            job.arrival = core.now()  # as the core took it: a new arrival
            priority = core.priority_for(job.ask.type, job.ask.fairness_key, priority)
            job.priority = priority
            jtype = core.type_of(job.ask.type)
            own = jtype.priority if priority is None else priority
            job.ask = job.ask._replace(priority=own, tier_cap=core.config.tier_cap(own))
            if self.state.mode is Mode.LOCAL:  # a tier this worker had no share of yet
                self._enter_local()
        return outcome

    def finish(
        self,
        uid: Hashable,
        elapsed: float | None,
        *,
        final: bool = False,
        unstarted: bool = False,
    ) -> None:
        """A started job ended after ``elapsed`` seconds (``None``: released without learning).

        ``final``: its message was acknowledged, so the broker will not deliver it again.
        ``unstarted``: it was admitted but never began, so its charge goes back to its key
        (in the core, and in the store).
        """
        core = self.core
        try:
            if elapsed is None:
                release = core.release(uid, refund=unstarted)
            else:
                release = core.complete(uid, elapsed)
        except UnknownJob:
            return
        self.observer.finished(release.type, core.type_of(release.type).priority, elapsed)
        job = self._jobs.pop(uid, None)
        if job is not None:
            self._report(job, elapsed, final, unstarted)

    def _report(self, job: _Tracked, elapsed: float | None, final: bool, unstarted: bool) -> None:
        """Tell the store with the next call that ``job`` ended (if it counts it as running)."""
        if job.in_store:
            self._done.append((Done(job.ask.uid, job.token, elapsed, final, unstarted), job))

    def reconsider(self, reserved: list[Hashable]) -> list[Hashable]:
        """Give back the admitted jobs that have not started (``reserved``) that newcomers
        now rank before; the jobs given back (``reserved.reconsider`` says how)."""
        return reserved_jobs.reconsider(self, reserved)

    def vet(self, reserved: list[Hashable]) -> Vetted:
        """Which admitted jobs that have not started (``reserved``) may start now, and which
        were given back for a lease that may have lapsed (``reserved.vet`` says how)."""
        return reserved_jobs.vet(self, reserved)

    def _give_back(self, uid: Hashable, job: _Tracked, *, revert: bool = True) -> None:
        """``job`` was admitted and does not start: pending again (``revert``: in the core,
        at its old place), and its end, unstarted, reported with the next call."""
        if revert:
            self.core.revert(uid)
        self._report(job, None, final=False, unstarted=True)
        job.token = 0

    # -- decisions out ---------------------------------------------------------------------

    def decide(self) -> Decision:
        """What to do now: jobs to start, copies to drop, and the store call to make, if any."""
        mode = self.state.mode
        if mode is Mode.ALONE:
            return Decision(self._schedule(), [], None)
        if self._inflight is not None:
            return NOTHING
        now = self.clock.now()
        if mode is not Mode.SHARED:  # hold or local (modes.py)
            start = self._admit_locally() if mode is Mode.LOCAL else []
            if now >= self._pause_until:  # the backoff has passed: probe the store
                return Decision(start, [], self._send(self._beat_call()))
            return Decision(start, [], None)
        if self.state.pending:
            sync = self._sync_call()
            if sync is not None:
                return Decision([], [], self._send(sync))
        if now >= self._beat_due + self.beat_interval:
            # A beat waits for a quiet moment, but not for ever: under a steady stream of
            # admissions it still comes, and with it the check for jobs the store lost.
            return Decision([], [], self._send(self._beat_call()))
        if self._stalled:
            self._retry_stalled(now)
        admissions = self._schedule() if now >= self._pause_until else []
        poll = now >= self._poll_due and self._waits_on_others()
        if poll and not admissions and not self._done and self._fleet.keys_elsewhere:
            # What waits may wait for a key's jobs on other workers: a beat reads their
            # counts (an admit call without asks does not).
            self._poll_due = now + self._poll_gap()
            return Decision([], [], self._send(self._beat_call()))
        if admissions or self._done or poll:
            call = AdmitCall(self.worker)
            call.done = [d for d, _ in self._done]
            call.finished = [job for _, job in self._done]
            self._done.clear()
            call.admissions = admissions
            jobs = self._jobs
            call.asks = [self._ask_now(jobs[a.uid], a) for a in admissions]
            if poll:
                call.watch = self.core.held_elsewhere()
                self._poll_due = now + self._poll_gap()
            return Decision([], [], self._send(call))
        if now >= self._beat_due:
            return Decision([], [], self._send(self._beat_call()))
        return NOTHING

    def _sync_call(self) -> Call | None:
        """The call that serves the first sync owed to the store (modes.SYNC_ORDER)."""
        due = self.state.due()
        if due is Sync.REGISTER:
            return self._register_call()
        if due is Sync.POLICIES:  # the store refused a paused job: learn the fleet's pauses
            self.state.on(Event.POLICIES_ASKED)
            return self._beat_call()
        return None

    def apply(self, call: Call, result: Any) -> Decision:
        """Feed back what ``call`` returned (or the exception it raised)."""
        self._inflight = None
        failed = isinstance(result, BaseException)
        self.observer.store_call(call.kind, self.clock.now() - call.sent, not failed)
        if failed:
            return self._failed(call, result)
        if call.sent - self._contact >= self._held_for:
            self._term += 1  # the lease may have lapsed since the last contact
        self._contact = call.sent
        state = self.state
        was = state.mode
        if state.on(Event.ANSWERED):
            self._recovered(was)
        self._degraded.backoff = 0.0
        return call.applied(self, result)

    def flush(self) -> None:
        """Report the finished jobs to the store now, inline (at shutdown). Best effort.

        What cannot be reported is released anyway when this worker's lease expires.
        """
        store = self.store
        if store is None or not self._done or self.state.mode is not Mode.SHARED:
            return
        done = [d for d, _ in self._done]
        self._done.clear()
        try:
            store.finish(self.worker, done)
        except Exception as exc:
            logger.warning(
                "celery-fair: could not report %d finished job(s) to the store (%s); they are "
                "released when this worker's lease expires.",
                len(done),
                exc,
            )

    def run_inline(self) -> Decision:
        """Decide and make every store call here and now, until nothing is left to do.

        For stores that live in this process (``MemoryStore``), for event loops that may
        block (the synchronous consumer loop), and for tests. Returns everything to start
        and to drop; the call of the returned decision is always ``None``.
        """
        if self.store is None:
            return Decision(self._schedule(), [], None)
        gathered = self._gathered = Decision([], [], None)
        self._inline.turn()
        self._gathered = NOTHING
        return gathered

    def _gather(self, decision: Decision) -> None:
        gathered = self._gathered
        gathered.start.extend(decision.start)
        gathered.drop.extend(decision.drop)

    # -- inspection ------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """A store call is in flight: what the core shows as running includes its proposals."""
        return self._inflight is not None

    @property
    def workers(self) -> int:
        """Live workers as the store last said (this one included; 1 before it said)."""
        return self._fleet.workers

    @property
    def mode(self) -> Mode:
        """Who decides admissions right now (modes.py)."""
        return self.state.mode

    def info(self) -> dict[str, object]:
        return {
            "mode": self.state.mode.value,
            "workers": self.workers,
            "stalled": len(self._stalled),
        }

    # -- internals: the shared path --------------------------------------------------------

    def _schedule(self) -> list[Admission]:
        """The core's decision, timed for the observer."""
        clock = self.clock
        began = clock.now()
        picks = self.core.schedule()
        self.observer.decided(clock.now() - began, len(picks))
        return picks

    def _send(self, call: Call) -> Call:
        self._inflight = call
        call.sent = self.clock.now()
        return call

    def _is_in_flight(self, uid: Hashable) -> bool:
        call = self._inflight
        return call is not None and call.proposes(uid)

    def _ask(
        self,
        uid: Hashable,
        jtype: JobType,
        job_id: str | None,
        fairness_key: str,
        cost: float | None,
        priority: int | None = None,
    ) -> Ask:
        key_cap, weight = self.core.key_terms(fairness_key)
        own = jtype.priority if priority is None else priority
        terms = self.core.tenant_terms(fairness_key)  # two-level keys: its tenant's
        tenant, tenant_cap, tenant_weight = (None, None, 1.0) if terms is None else terms
        return Ask(
            str(uid),
            jtype.name,
            own,
            self.core.config.tier_cap(own),
            jtype.max_concurrency,
            conflict_field(jtype.conflict_group, job_id),
            estimate_field(jtype.name, job_id),
            fairness_key,
            cost,
            jtype.default_cost,
            key_cap,
            weight,
            type_rate=jtype.rate,  # a type's terms never change (its key's: _ask_now)
            type_burst=jtype.bucket,
            type_per_cost=jtype.per == "cost",
            tenant=tenant,
            tenant_weight=tenant_weight,
            tenant_cap=tenant_cap,
        )  # its key's rate terms come with each ask (_ask_now): they may change before then

    def _ask_now(self, job: _Tracked, admission: Admission) -> Ask:
        """``job``'s ask with its key's cap, weight and rate as the core has them now (runtime
        policies may have changed them since it was submitted). An urgent job passes its
        key's cap (docs/design.md 5e), so the store must not count the key against it, and
        claims the next free slot of a full tier or type for as long as a few polls take."""
        ask = job.ask
        if admission.priority != ask.priority:  # its key's max_priority fell since its submit
            own = admission.priority
            ask = job.ask = ask._replace(priority=own, tier_cap=self.core.config.tier_cap(own))
        key_cap, weight = self.core.key_terms(ask.fairness_key)
        claim = None
        if admission.urgent:
            key_cap = None
            claim = self.claim_seconds
        elif self.foreground:
            claim = self.claim_seconds
        if key_cap != ask.key_cap or weight != ask.weight or claim != ask.claim:
            ask = job.ask = ask._replace(key_cap=key_cap, weight=weight, claim=claim)
        if ask.tenant is not None:  # two-level keys: its tenant's terms now (urgent: no cap)
            terms = self.core.tenant_terms(ask.fairness_key)
            assert terms is not None
            _, tenant_cap, tenant_weight = terms
            if admission.urgent:
                tenant_cap = None
            if tenant_cap != ask.tenant_cap or tenant_weight != ask.tenant_weight:
                ask = job.ask = ask._replace(tenant_cap=tenant_cap, tenant_weight=tenant_weight)
        changed = _rate_changes(ask, "", self.core.key_rate(ask.fairness_key))
        if ask.tenant is not None:  # and its tenant's rate, one bucket for all its keys
            changed |= _rate_changes(ask, "tenant_", self.core.tenant_rate(ask.fairness_key))
        if changed:
            ask = job.ask = ask._replace(**changed)
        return ask

    @property
    def claim_seconds(self) -> float:
        """How long an urgent job's claim on a full tier or type lasts unless it asks again:
        four polls (it asks at every poll), and at least a second."""
        return max(1.0, 4 * self.poll_interval)

    def _apply_admit(self, call: AdmitCall, reply: Reply) -> Decision:
        return replies.apply_admit(self, call, reply)

    def _apply_beat(self, call: BeatCall, view: View) -> None:
        replies.apply_beat(self, call, view)

    def _apply_register(self, call: RegisterCall, result: Registered) -> None:
        replies.apply_register(self, call, result)

    @property
    def policy_version(self) -> int:
        """The runtime policies' version this worker follows (-1: not read yet, 0: none)."""
        return self._policy_version

    def _see_policies(self, version: int, doc: str) -> None:
        """The fleet's runtime policies changed (policies.py): follow them. A document this
        worker cannot read is logged and skipped; it keeps the policies it had."""
        self._policy_version = version
        try:
            runtime = RuntimePolicies.from_json(doc)
            apply_to(self.core, self._configured_keys, runtime)
        except ConfigurationError as exc:
            logger.error("celery-fair: runtime policies version %d ignored: %s", version, exc)
            return
        self.runtime_policies = runtime
        logger.info("celery-fair: runtime policies version %d: %s", version, doc or "none")

    def _beat_call(self) -> BeatCall:
        call = BeatCall(self.worker)
        call.policies = self._policy_version
        call.watch = self.core.held_elsewhere()
        call.keys = self.core.pending_keys()
        call.tenants = self.core.pending_tenants()
        return call

    def _register_call(self) -> RegisterCall:
        """Every job running here, for the store to put back those it does not know.

        They are marked as known at once, so that one finishing meanwhile is reported after
        the registration; if the call fails, the marks are taken back.
        """
        call = RegisterCall(self.worker)
        if self.state.owes(Sync.RECONCILE):
            call.keep = [done.uid for done, _ in self._done]
        for job in self._jobs.values():
            if job.token:  # admitted (by the store, or locally during an outage): running
                ask = job.ask
                call.running.append(
                    Running(
                        ask.uid,
                        job.token,
                        ask.type,
                        ask.priority,
                        ask.conflict,
                        ask.estimate_key,
                        ask.fairness_key,
                        _charged(job),
                        ask.default_cost,
                        ask.tenant,
                        _tenant_charged(job),
                    )
                )
                if not job.in_store:
                    self._count_mine(job, 1)
                    call.flipped.append(job)
        return call

    def _count_mine(self, job: _Tracked, n: int) -> None:
        """``job`` starts (1) or stops (-1) counting as running here in the store's eyes."""
        job.in_store = n > 0
        self._fleet.count(job.ask, n)

    def _see_epoch(self, epoch: str) -> None:
        if self.epoch and epoch != self.epoch:
            logger.warning(
                "celery-fair: the store came back empty (epoch %s, was %s); re-registering "
                "the jobs this worker runs.",
                epoch,
                self.epoch,
            )
            if self.state.on(Event.LOST):
                self.observer.lease_lost()
        self.epoch = epoch

    def _poll_gap(self) -> float:
        """Seconds to the next look at the store while jobs here wait on other workers: about
        the time until one of the jobs they run ends (each type's count over its learned cost),
        between ``MIN_POLL`` and ``poll_interval``. Each of their ends may free a place in a
        cap they fill, and a look only every ``poll_interval`` left a free slot here idle that
        long (20 ms jobs on three RabbitMQ workers of two slots under a tier cap of 8, reserved
        jobs counted: 1.91 times plain Celery's time, 1.68 with this; docs/benchmarks.md).
        O(types running)."""
        rate = 0.0
        core = self.core
        for type, n in self._fleet.types_else.items():
            if n > 0 and type in core.types:
                rate += n / max(core.type_cost(type), MIN_POLL)
        if rate <= 0.0:
            return self.poll_interval
        return min(self.poll_interval, max(MIN_POLL, 1.0 / rate))

    def _waits_on_others(self) -> bool:
        """Could something here start if other workers let go of what they run or hold?"""
        core = self.core
        if self._stalled:
            return True
        if core.pending == 0 or core.running >= core.capacity:
            return False
        fleet = self._fleet
        return fleet.others_run or fleet.keys_elsewhere or bool(core.held_elsewhere())

    def _retry_stalled(self, now: float) -> None:
        for uid, due in list(self._stalled.items()):
            if due <= now:
                del self._stalled[uid]
                job = self._jobs[uid]
                ask = job.ask
                self.core.submit(
                    uid, ask.type, job.job_id, ask.fairness_key,
                    arrival=job.arrival, cost=job.cost, priority=job.priority,
                )  # fmt: skip

    # -- internals: outages ----------------------------------------------------------------

    def _unsent(self, call: AdmitCall) -> None:
        """``call`` failed: its admissions are pending again, its ends ride on the next call."""
        core = self.core
        for admission in call.admissions:
            core.revert(admission.uid)
            job = self._jobs.get(admission.uid)
            if job is not None and job.cancelled:
                core.cancel(admission.uid)
                del self._jobs[admission.uid]
        self._done[:0] = list(zip(call.done, call.finished, strict=True))

    def _unregistered(self, call: RegisterCall) -> None:
        """``call`` failed: its jobs are not known to the store after all. The register sync
        stays owed (only an answer settles it), so the next call in shared mode is another."""
        for job in call.flipped:
            self._count_mine(job, -1)

    def _failed(self, call: Call, exc: BaseException) -> Decision:
        call.failed(self)
        self._pause_until = self.clock.now() + self._degraded.failed()
        state = self.state
        if state.on(Event.UNREACHABLE):  # was shared: now the outage mode
            self.observer.outage(state.mode.value)
            logger.warning(
                "celery-fair: the shared store is unreachable (%s); %s until it answers again.",
                exc,
                "admitting on this worker's share of each cap (jobs with a conflict wait)"
                if state.mode is Mode.LOCAL
                else "admitting nothing new",
            )
            if state.mode is Mode.LOCAL:
                self._enter_local()
        return Decision(self._admit_locally() if state.mode is Mode.LOCAL else [], [], None)

    def _recovered(self, was: Mode) -> None:
        """The store answers again after an outage (the mode is shared once more)."""
        self._degraded.answered(self.core)
        if any(job.token and not job.in_store for job in self._jobs.values()):
            self.state.on(Event.RUNS_UNKNOWN)
        self.observer.recovered()
        logger.warning("celery-fair: the shared store answers again (was %s).", was.value)

    def _enter_local(self) -> None:
        """Local mode: this worker's share of every cap; no job with a conflict starts."""
        core = self.core
        jobs = self._jobs.values()
        degraded = self._degraded
        degraded.enter_local(core, self.workers, (job.ask.priority for job in jobs))
        for job in jobs:
            degraded.hold(core, job.group, job.job_id)

    def _admit_locally(self) -> list[Admission]:
        out = []
        for admission in self._schedule():
            token = self._degraded.token(self._max_token)
            job = self._jobs[admission.uid]
            job.token = token
            job.estimate = admission.estimate
            out.append(admission._replace(token=token))
        return out

    # -- for callers that wait for a slot in their own process (slots.py) -------------------

    def wake(self) -> None:
        """A job ended somewhere in the fleet: if anything here waits for what other workers
        run or hold, the next ``decide`` looks at the store now, not at the next poll, and
        asks again for the jobs that wait for a shared cap. O(stalled jobs)."""
        now = self.clock.now()
        self._poll_due = now
        stalled = self._stalled
        for uid, due in stalled.items():
            if due > now:
                stalled[uid] = now

    @property
    def idle(self) -> bool:
        """Nothing to ask or tell the store: no job held, no end to report, no call in flight.
        O(1)."""
        return not self._jobs and not self._done and self._inflight is None
