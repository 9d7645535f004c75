"""The gate's parts alone (worker/held.py, reserve.py, housekeeping.py, window.py, pacing.py,
job_control.py): each holds one concern, takes no lock, and is driven here without a gate,
a broker or a worker. tests/unit/test_gate.py drives them together through a real gate."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_fair.core import BlockReason, JobType, ReserveDepth, Scheduler, SimClock
from celery_fair.core.types import JobState, JobView
from celery_fair.engine import Engine
from celery_fair.errors import SchedulerError
from celery_fair.observe import CONTROL_ANSWERS, Observer
from celery_fair.protocol import ControlAnswer as Answer
from celery_fair.settings import FairSettings
from celery_fair.store.memory import MemoryStore
from celery_fair.worker.headers import FairHeaders
from celery_fair.worker.held import REMEMBERED, Held, HeldJobs
from celery_fair.worker.housekeeping import (
    Pace,
    blocks_the_queue,
    default_max_hold,
    spill_victims,
    stale,
)
from celery_fair.worker.job_control import JobControl
from celery_fair.worker.reserve import Reserve, plan_reserve
from celery_fair.worker.runs import Runs
from celery_fair.worker.shard_turns import ShardTurns, slot_of
from celery_fair.worker.window import SETTLE, Windows, blocked_idle


def headers(key: str = "a", job_type: str = "build", paused_spill: int | None = None) -> Any:
    return SimpleNamespace(
        fairness_key=key,
        job_type=job_type,
        job_id=None,
        submitted=None,
        republished=0,
        paused_spill=paused_spill,
    )


def held(task_id: str, received: float = 0.0, **kw: Any) -> Held:
    req = SimpleNamespace(id=task_id, name="tasks.build", expires=None)
    h: FairHeaders = headers(**kw)
    return Held(req, received, h, arrival=received)


def view(uid: str, place: int, *blocked: BlockReason) -> JobView:
    return JobView(uid, "build", None, "a", 5, 0.0, JobState.PENDING, place, place, tuple(blocked))


# -- held.py ------------------------------------------------------------------------------


def test_held_jobs_keep_receipt_order_aliases_and_shard_counts() -> None:
    turns = ShardTurns(shards=4, window=lambda: 1)
    jobs = HeldJobs(turns)
    jobs.add("t1", held("t1", 1.0), shard=2)
    jobs.add("t2/retry-1", held("t2", 2.0), shard=2)  # a retry: its uid is not its task id
    jobs.add("t3", held("t3", 3.0), shard=None)  # not counted in a shard
    assert list(jobs) == ["t1", "t2/retry-1", "t3"]
    assert jobs.oldest() is jobs.get("t1")
    assert jobs.uid_of("t2") == "t2/retry-1"
    assert jobs.uid_of("t1") == "t1"
    assert turns.held[:4] == [0, 0, 2, 0]
    assert jobs.peak == 3
    # a job that starts keeps its alias (job control finds it running); one dropped does not
    assert jobs.take("t2/retry-1", starts=True) is not None
    assert jobs.uid_of("t2") == "t2/retry-1"
    jobs.unalias("t2", "t2/retry-1")
    assert jobs.uid_of("t2") == "t2"
    assert turns.held[:4] == [0, 0, 1, 0]
    assert jobs.take("t1") is not None
    assert jobs.take("t1") is None
    assert turns.held[:4] == [0, 0, 0, 0]
    assert len(jobs) == 1
    assert jobs.peak == 3


def test_held_jobs_remember_the_latest_priorities_up_to_their_bound() -> None:
    jobs = HeldJobs()
    jobs.remember("x", 3)
    jobs.remember("x", 9)  # the last one given counts
    assert jobs.take_remembered("x") == (True, 9)
    assert jobs.take_remembered("x") == (False, None)
    jobs.remember("none", None)  # "its type's priority" is remembered too
    assert jobs.take_remembered("none") == (True, None)
    for i in range(REMEMBERED + 1):
        jobs.remember(f"t{i}", 1)
    assert jobs.take_remembered("t0") == (False, None)  # the oldest went
    assert jobs.take_remembered(f"t{REMEMBERED}") == (True, 1)


def test_a_received_job_waits_from_its_publish_unless_given_a_priority_on_its_way() -> None:
    jobs = HeldJobs()
    published: Any = SimpleNamespace(**{**vars(headers()), "submitted": 100.0, "priority": 4})
    plain = jobs.receive(SimpleNamespace(id="t1"), published, received=7.0, now=130.0)
    assert (plain.arrival, plain.priority, plain.received) == (100.0, 4, 7.0)
    unstamped: Any = SimpleNamespace(**{**vars(headers()), "priority": None})
    assert jobs.receive(SimpleNamespace(id="t2"), unstamped, 7.0, now=130.0).arrival == 130.0
    jobs.remember("t3", 9)  # reprioritised while it was in the broker
    given = jobs.receive(SimpleNamespace(id="t3"), published, 7.0, now=130.0)
    assert (given.arrival, given.priority) == (130.0, 9)  # a new priority restarts its wait
    assert not jobs  # receiving is not holding


def test_held_jobs_count_tiers_and_each_keys_oldest_arrival() -> None:
    jobs = HeldJobs()
    jobs.add("a1", held("a1", 5.0, key="a"))
    jobs.add("a2", held("a2", 4.0, key="a"))
    jobs.add("b1", held("b1", 6.0, key="b", job_type="deploy"))
    jobs.get("a2").priority = 9  # type: ignore[union-attr]
    priorities = {"build": 5, "deploy": 7}
    assert jobs.by_tier(priorities.__getitem__) == {5: 1, 9: 1, 7: 1}
    counts, oldest = jobs.by_type(priorities.__getitem__)
    assert counts == {("build", 5): 2, ("deploy", 7): 1}
    assert oldest == {"a": 4.0, "b": 6.0}


# -- housekeeping.py ----------------------------------------------------------------------


def test_spill_victims_are_the_lowest_ranked_tenth_lowest_first() -> None:
    pending = [view(f"j{i}", i, BlockReason.CONFLICT) for i in range(1, 26)]
    victims = spill_victims(pending, lambda uid: None, version=1)
    assert [v.uid for v in victims] == ["j25", "j24"]  # 25 // 10 = 2, the last first
    assert [v.uid for v in spill_victims(pending[:3], lambda uid: None, 1)] == ["j3"]
    assert spill_victims([], lambda uid: None, 1) == []


def test_a_paused_job_is_spilled_only_if_nothing_else_can_be_and_once_per_version() -> None:
    paused = [view(f"p{i}", i, BlockReason.PAUSED) for i in range(1, 4)]
    capped = [view("c1", 4, BlockReason.TYPE_CAP)]
    # something not paused can go: the paused ones stay
    assert [v.uid for v in spill_victims(paused + capped, lambda uid: None, 7)] == ["c1"]
    # only paused jobs: they go, but not one already returned under this version
    marks = {"p3": 7, "p2": 6}
    victims = spill_victims(paused, marks.get, 7)
    assert [v.uid for v in victims] == ["p2"]  # p3 was returned under version 7 already
    assert spill_victims(paused, lambda uid: 7, 7) == []


def test_held_work_blocks_the_queue_only_when_full_with_a_slot_free_and_nothing_deciding() -> None:
    full = {"held": 10, "max_held": 10}
    assert blocks_the_queue(**full, running=1, capacity=2, deciding=False)
    assert not blocks_the_queue(**full, running=2, capacity=2, deciding=False)  # all busy
    assert not blocks_the_queue(**full, running=1, capacity=2, deciding=True)  # may take it
    assert not blocks_the_queue(held=9, max_held=10, running=0, capacity=2, deciding=False)


def test_old_holds_and_default_hold_times() -> None:
    jobs = [held("t1", 1.0), held("t2", 5.0), held("t3", 9.0)]
    assert [h.req.id for h in stale(jobs, deadline=5.0)] == ["t1", "t2"]
    assert stale(jobs, deadline=0.5) == []
    assert default_max_hold("redis", {"visibility_timeout": 100}) == 50.0
    assert default_max_hold("redis", None) == 1800.0  # Kombu's default: an hour
    assert default_max_hold("amqp", {}) == 900.0  # RabbitMQ's consumer_timeout: 30 min
    assert default_max_hold("memory", {}) == float("inf")


def test_pace_says_yes_at_most_once_per_interval() -> None:
    pace = Pace(10.0)
    assert [pace.due(t) for t in (0.0, 9.9, 10.0, 15.0, 20.5)] == [True, False, True, False, True]


# -- window.py ----------------------------------------------------------------------------


class QoS:
    def __init__(self) -> None:
        self.value = 0

    def increment_eventually(self, n: int) -> None:
        self.value += n

    def decrement_eventually(self, n: int) -> None:
        self.value -= n


def test_windows_bound_what_is_held_with_shards_on_redis_and_open_sweep_by_sweep_while_blocked():
    qos, capacity = QoS(), [3]
    redis = Windows(lambda: qos, lambda: capacity[0], max_held=100, shards=8, driver="redis")
    assert redis.turns is not None
    assert redis.shard_window == 4
    assert redis.limit() == 3 + 8
    # a process idles that no held job can take: each such sweep takes in more to find work,
    seen = []
    for _ in range(6):
        redis.opening.observe(True)
        seen.append(redis.limit())
    assert seen == [3 + 8 + 8, 3 + 8 + 16, 3 + 8 + 32, 3 + 8 + 64, 100, 100]
    # never beyond fair_max_held, and SETTLE calm sweeps close it again.
    for _ in range(SETTLE):
        redis.opening.observe(False)
    assert redis.limit() == 3 + 8
    capacity[0] = 200
    assert redis.limit() == 100  # never beyond fair_max_held
    amqp = Windows(lambda: qos, lambda: 3, max_held=100, shards=8, driver="amqp")
    assert amqp.turns is None
    assert amqp.limit() == 100
    one = Windows(lambda: qos, lambda: 3, max_held=100, shards=1, driver="redis")
    assert one.turns is None
    assert one.limit() == 100
    capacity[0] = 3
    redis.follow(held=50, fair_inside=True)
    assert qos.value == 3 + 8 + 1  # the channel's window: the limit plus one look


def test_on_redis_a_held_lane_is_one_more_look_and_stragglers_leave_their_shard_first() -> None:
    qos = QoS()
    windows = Windows(lambda: qos, lambda: 3, max_held=100, shards=8, driver="redis", lanes=4)
    turns = windows.turns
    assert turns is not None
    assert windows.limit() == 3 + 8
    turns.add(8 + 2)  # a message from lane 2
    assert windows.limit() == 3 + 8 + 1
    straggler = slot_of("q.fair.5", "A", 2, 8, 4)  # from A's shard, A has lane 2 now
    assert straggler == 8 + 4 + 5  # shard 5's stragglers
    for _ in range(4):
        turns.add(straggler)
    # Stragglers take their places (given more, the next reads would fill them from A's lane),
    assert windows.limit() == 3 + 8 + 1
    # and they do not count in their shard: it is read first, before A's lane, held a window of.
    for _ in range(3):
        turns.add(8 + 2)
    queues = ["q.fair.lane.2", "q.fair.5"]
    assert turns.order(queues) == ["q.fair.5", "q.fair.lane.2"]


def test_a_process_idles_blocked_only_if_a_real_slot_is_free_and_no_decision_may_fill_it():
    assert blocked_idle(starved=True, running=1, capacity=3, lookahead=1, deciding=False)
    # a free place in the reserve only,
    assert not blocked_idle(starved=True, running=2, capacity=3, lookahead=1, deciding=False)
    assert not blocked_idle(starved=False, running=0, capacity=3, lookahead=1, deciding=False)
    # and a free process that a decision due or in flight may fill (a job ended since the
    # last one, here or elsewhere) are not.
    assert not blocked_idle(starved=True, running=1, capacity=3, lookahead=1, deciding=True)


# -- reserve.py ---------------------------------------------------------------------------


class FakeEngine:
    """The two engine calls the reserve makes, answering what the test sets."""

    def __init__(self) -> None:
        self.busy = False
        self.give_back: list[str] = []  # reconsider's answer
        self.unsound: list[str] = []  # vet gives these back
        self.calls: list[str] = []

    def reconsider(self, reserved: list[str]) -> list[str]:
        self.calls.append("reconsider")
        return [u for u in reserved if u in self.give_back]

    def vet(self, reserved: list[str]) -> Any:
        self.calls.append("vet")
        return SimpleNamespace(
            ready=[u for u in reserved if u not in self.unsound],
            given_back=[u for u in reserved if u in self.unsound],
        )


def test_the_reserve_starts_vetted_jobs_in_admission_order_and_rechecks_after_a_newcomer() -> None:
    reserve, engine = Reserve(lookahead=3), FakeEngine()
    for uid in ("r1", "r2", "r3"):
        reserve.add(uid, SimpleNamespace(uid=uid))  # type: ignore[arg-type]
    engine.unsound = ["r2"]
    assert reserve.startable(engine, room=False) == []  # no free process: not even vetted
    assert engine.calls == []
    assert reserve.startable(engine, room=True) == ["r1", "r3"]
    assert list(reserve) == ["r1", "r3"]  # r2 given back: pending again
    reserve.recheck = True
    engine.busy = True
    assert reserve.startable(engine, room=True) == []  # the store decides: wait for it
    assert reserve.recheck
    engine.busy, engine.give_back, engine.unsound = False, ["r3"], []
    assert reserve.startable(engine, room=True) == ["r1"]
    assert not reserve.recheck
    assert list(reserve) == ["r1"]
    assert engine.calls[-2:] == ["reconsider", "vet"]


def test_the_reserve_follows_wall_times_only_with_a_sizer() -> None:
    fixed = Reserve(lookahead=2)
    fixed.observe(0.001, slots=4)
    assert fixed.lookahead == 2
    assert not fixed.adaptive
    adaptive = Reserve(1, ReserveDepth(0.01, minimum=1, maximum=8))
    adaptive.observe(0.001, slots=4)  # 1 ms jobs on 4 processes: 40 cover 10 ms, capped at 8
    assert adaptive.lookahead == 8
    assert adaptive.refill_mark() == 2
    for _ in range(60):
        adaptive.observe(5.0, slots=4)
    assert adaptive.lookahead == 1
    assert adaptive.refill_mark() == 0


def test_plan_reserve_gives_a_lookahead_only_to_pools_whose_ends_come_on_the_loop() -> None:
    from celery.concurrency.solo import TaskPool as SoloPool
    from celery.concurrency.thread import TaskPool as ThreadPool

    settings = FairSettings.from_mapping({})
    lookahead, sizer = plan_reserve(settings, ThreadPool(limit=2), shared=True)
    assert lookahead == 1
    assert sizer is not None  # adaptive by default with a store
    assert plan_reserve(settings, ThreadPool(limit=2), shared=False) == (0, None)
    fixed = FairSettings.from_mapping({"fair_lookahead": 3})
    assert plan_reserve(fixed, ThreadPool(limit=2), shared=True) == (3, None)
    assert plan_reserve(fixed, SoloPool(limit=1), shared=True) == (0, None)  # ignored, warned


# -- job_control.py -----------------------------------------------------------------------


def test_job_control_answers_for_each_place_a_job_can_be() -> None:
    clock = SimClock(1000.0)
    types = [JobType("build", priority=5)]
    scheduler = Scheduler(FairSettings.from_mapping({}).scheduler_config(0), clock, types)
    said: list[tuple[str, str]] = []

    class Said(Observer):
        def controlled(self, operation: str, answer: str) -> None:
            said.append((operation, answer))

    engine = Engine(scheduler, MemoryStore(clock=clock), worker="w", clock=clock)
    jobs, reserve, runs = HeldJobs(), Reserve(), Runs(clock.now)
    forgotten: list[str] = []
    control = JobControl(
        jobs, reserve, runs, engine, Said(), forget=forgotten.append, dispatch=lambda: None
    )
    revoked = {"h1"}

    def hold(uid: str) -> None:
        h = held(uid)
        h.req.revoked = lambda: uid in revoked
        jobs.add(uid, h)
        engine.submit(uid, "build", None, "a", arrival=clock.now())

    hold("h1")
    hold("h2")
    assert control.cancel("h1") is Answer.CANCELLED
    assert forgotten == ["h1"]
    assert control.cancel("h2") is None  # not in the revoked set: not cancelled here
    assert control.cancel("nowhere") is None
    assert control.reprioritize("h2", 9) is Answer.OK
    assert jobs.get("h2").priority == 9  # type: ignore[union-attr]
    reserve.add("h2", SimpleNamespace())  # type: ignore[arg-type]
    assert control.reprioritize("h2", 3) is Answer.ALREADY_RUNNING
    assert control.reprioritize("later", 8) is None  # not here: remembered
    assert jobs.take_remembered("later") == (True, 8)
    runs.add(SimpleNamespace(id="r1"), "r1")
    assert control.cancel("r1") is Answer.ALREADY_RUNNING
    with pytest.raises(SchedulerError, match="priority"):
        control.reprioritize("h2", 0)
    assert said == [
        ("cancel", "cancelled"),
        ("cancel", "elsewhere"),
        ("cancel", "elsewhere"),
        ("reprioritize", "ok"),
        ("reprioritize", "already_running"),
        ("reprioritize", "elsewhere"),
        ("cancel", "already_running"),
    ]
    assert set(dict(said).values()) | {a for _, a in said} <= set(CONTROL_ANSWERS)
