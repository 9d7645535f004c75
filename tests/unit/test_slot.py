"""In-process slots (``celery_fair.slot``, slots.py) on the in-memory store: several
schedulers sharing one ``MemoryStore`` stand for several processes, and an ``Engine`` on the
same store for a worker."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from celery_fair import Slot, SlotTimeout
from celery_fair.core import CostLifecycle, JobType, Scheduler, SchedulerConfig, WallClock
from celery_fair.engine import Engine
from celery_fair.errors import UnknownJobType
from celery_fair.slots import SlotScheduler, store_lock
from celery_fair.store import MemoryStore, estimate_field
from spans import max_overlap

REPACK = JobType("repack", 4, max_concurrency=2, conflict_group="git", default_cost=1.0)
SOLO = JobType("solo", 4, max_concurrency=1, default_cost=1.0)
TYPES = {t.name: t for t in (REPACK, SOLO)}


def scheduler(store=None, capacity=4, poll_interval=0.05, **options):
    config = SchedulerConfig(capacity, lifecycle=CostLifecycle.never())
    made = SlotScheduler(TYPES, config, store, poll_interval=poll_interval, **options)
    return made


@pytest.fixture
def made():
    schedulers = []

    def factory(*args, **kwargs):
        s = scheduler(*args, **kwargs)
        schedulers.append(s)
        return s

    yield factory
    for s in schedulers:
        s.close()


def run_threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not any(t.is_alive() for t in threads)


def test_slots_alone_take_turns_on_the_capacity(made):
    # Given a process deciding alone with one slot,
    s = made(capacity=1)
    spans = []

    def body():
        with Slot("repack", scheduler=s, timeout=10):
            began = time.time()
            time.sleep(0.05)
            spans.append((began, time.time()))

    # when four callers want it at once, then each runs, one at a time.
    run_threads([body] * 4)
    assert len(spans) == 4
    assert max_overlap(spans) == 1


def test_schedulers_sharing_a_store_hold_the_type_cap_together(made):
    # Given two processes (schedulers of 4 slots each) on one store, and a type capped at 2,
    store = MemoryStore(lifecycle=CostLifecycle.never())
    a, b = made(store), made(store)
    spans = []

    def body(s, i):
        def run():
            with Slot("repack", f"r{i}", f"k{i % 3}", scheduler=s, timeout=20):
                began = time.time()
                time.sleep(0.05)
                spans.append((began, time.time()))

        return run

    # when eight callers, four in each, run repacks at once,
    run_threads([body(a if i % 2 else b, i) for i in range(8)])
    # then all ran, never more than two at once, and the cap was reached.
    assert len(spans) == 8
    assert max_overlap(spans) == 2
    wait_for(lambda: store.types == {}, "every slot released")


def worker_engine(store):
    core = Scheduler(SchedulerConfig(2, lifecycle=CostLifecycle.never()), WallClock(), [REPACK])
    return Engine(core, store, worker="w1", poll_interval=0.05)


def test_a_slot_waits_for_a_conflict_that_a_worker_job_holds(made):
    # Given a worker running a repack of linux,
    store = MemoryStore(lifecycle=CostLifecycle.never())
    worker = worker_engine(store)
    worker.submit("job1", "repack", "linux", "bg", arrival=time.time())
    with store_lock(store):
        assert [a.uid for a in worker.run_inline().start] == ["job1"]
    s = made(store)
    # when a slot on linux waits 0.3 s, it times out, withdrawn, saying what held it,
    late = Slot("repack", "linux", "web", scheduler=s, timeout=0.3)
    with pytest.raises(SlotTimeout, match=r"not admitted within 0\.3 s") as caught, late:
        pytest.fail("ran while the worker held the conflict")
    assert any("conflict" in r for r in caught.value.reasons), caught.value.reasons
    assert s.waiting == 0
    assert store.types == {"repack": 1}  # only the worker's job counts
    # and a slot on another repository runs meanwhile (the cap is 2).
    with Slot("repack", "gcc", "web", scheduler=s, timeout=5):
        assert store.types == {"repack": 2}
    # A slot on linux waiting while the worker's job ends starts right after it.
    entered = []

    def body():
        with Slot("repack", "linux", "web", scheduler=s, timeout=10):
            entered.append(time.time())

    t = threading.Thread(target=body)
    t.start()
    # it waits on the conflict, which the core knows a worker holds since the first refusal
    wait_for(lambda: s.core.blocked_counts().get("conflict") == 1, "it to wait on the conflict")
    assert not entered
    ended = time.time()
    worker.finish("job1", 0.5, final=True)
    with store_lock(store):
        worker.run_inline()
    t.join(10)
    assert entered
    assert entered[0] >= ended


def test_a_release_in_one_process_wakes_a_caller_waiting_in_another(made):
    # Given two schedulers on one store whose fallback look is 30 s away,
    store = MemoryStore(lease=300.0, lifecycle=CostLifecycle.never())
    a, b = made(store, poll_interval=30.0), made(store, poll_interval=30.0)
    for _ in range(3):
        # when one holds the only slot of "solo" and a caller of the other waits for it,
        inside = Slot("solo", scheduler=a, timeout=5)
        inside.__enter__()
        entered = []

        def body(entered=entered):
            with Slot("solo", scheduler=b, timeout=10):
                entered.append(time.monotonic())

        refused = b.engine.observer.counts["refused"]
        t = threading.Thread(target=body)
        t.start()
        # its first ask is refused: the type is full
        wait_for(lambda n=refused: b.engine.observer.counts["refused"] > n, "the refusal")
        assert not entered
        # then it enters right after the release, not at the next look.
        released = time.monotonic()
        inside.__exit__(None, None, None)
        t.join(10)
        assert entered
        assert entered[0] - released < 1.0, entered[0] - released


def test_the_cost_is_learned_and_charged_to_the_key(made):
    store = MemoryStore(lifecycle=CostLifecycle.never())
    s = made(store)
    with Slot("repack", "linux", "10.0.0.7", scheduler=s, timeout=5) as inside:
        assert inside.admission is not None
        assert inside.admission.estimate == 1.0
        time.sleep(0.2)
    # The key was charged the estimate at admission; the release (made by the loop thread,
    # at once) teaches the store the elapsed time.
    wait_for(lambda: not store.jobs, "the release to reach the store")
    assert store.acc["10.0.0.7"] == 1.0
    learned = store.est[estimate_field("repack", "linux")]
    assert learned == pytest.approx(0.3 * inside.elapsed + 0.7 * 1.0)
    assert inside.elapsed >= 0.2


def wait_for(predicate, what, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_an_exception_in_the_block_releases_the_slot(made):
    store = MemoryStore(lifecycle=CostLifecycle.never())
    s = made(store)
    with pytest.raises(ValueError, match="boom"), Slot("solo", "x", "k", scheduler=s, timeout=5):
        raise ValueError("boom")
    # The only slot of the type is free again at once.
    with Slot("solo", "y", "k", scheduler=s, timeout=1):
        pass
    wait_for(lambda: not store.jobs and s.engine.idle, "everything released")


def test_an_unknown_type_is_refused_by_name(made):
    s = made()
    with (
        pytest.raises(UnknownJobType, match=r"'nope'.*known: repack, solo"),
        Slot("nope", scheduler=s),
    ):
        pass
    assert s.waiting == 0


def test_a_type_declared_later_is_found_again(made):
    late = JobType("late", 3)
    s = made(resolve=lambda: {**TYPES, "late": late})
    with Slot("late", scheduler=s, timeout=5) as inside:
        assert inside.admission is not None
        assert inside.admission.type == "late"


def test_a_slot_is_entered_once(made):
    s = made()
    once = Slot("solo", scheduler=s, timeout=5)
    with once:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        once.__enter__()


def test_async_slot_waits_without_blocking_the_event_loop(made):
    # Given a process with one slot, taken by a synchronous caller for 0.3 s,
    s = made(capacity=1)
    holder = Slot("solo", scheduler=s, timeout=5)
    holder.__enter__()
    threading.Timer(0.3, holder.__exit__, (None, None, None)).start()

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        # when a coroutine waits for the slot,
        async with Slot("solo", scheduler=s, timeout=5) as inside:
            entered = ticks
        stop.set()
        await task
        return entered, inside

    entered, inside = asyncio.run(main())
    # then the loop kept running meanwhile, and it entered once the holder left.
    assert entered >= 10, entered
    assert inside.waited is not None
    assert inside.waited >= 0.2
    assert s.waiting == 0


def test_async_slot_past_its_timeout_raises_and_is_withdrawn(made):
    s = made(capacity=1)
    holder = Slot("solo", scheduler=s, timeout=5)
    holder.__enter__()

    async def main():
        async with Slot("solo", "x", scheduler=s, timeout=0.2):
            pytest.fail("ran while the only slot was taken")

    with pytest.raises(SlotTimeout, match=r"slot solo on x was not admitted within 0\.2 s"):
        asyncio.run(main())
    assert s.waiting == 0
    holder.__exit__(None, None, None)
    with Slot("solo", scheduler=s, timeout=1):
        pass


def test_a_cancelled_async_wait_gives_its_place_back(made):
    store = MemoryStore(lifecycle=CostLifecycle.never())
    s = made(store, capacity=1)
    holder = Slot("solo", scheduler=s, timeout=5)
    holder.__enter__()

    async def main():
        async def wait():
            async with Slot("solo", scheduler=s):
                pytest.fail("a cancelled wait ran")

        task = asyncio.create_task(wait())
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert s.waiting == 0
    holder.__exit__(None, None, None)
    with Slot("solo", scheduler=s, timeout=1):
        assert store.types == {"solo": 1}
    wait_for(lambda: not store.jobs, "the release")


def test_an_admission_whose_event_loop_is_gone_is_given_back(made):
    # A coroutine's loop closed while it waited: its admission must not hold the slot.
    store = MemoryStore(lifecycle=CostLifecycle.never())
    s = made(store, capacity=1)
    holder = Slot("solo", scheduler=s, timeout=5)
    holder.__enter__()
    loop = asyncio.new_event_loop()
    orphan = s.submit("solo", None, "k", notify=lambda: loop.call_soon_threadsafe(print))
    loop.close()
    holder.__exit__(None, None, None)
    wait_for(lambda: orphan.gone, "the orphan's admission to be given back")
    with Slot("solo", scheduler=s, timeout=1):
        pass
