"""The intake: fair messages that producers published to a queue move into their key's shard,
losslessly, by the same rule the producer side uses.

The first tests run an intake (Redis: its script; RabbitMQ: its consumer) on messages Kombu
published to the real broker, and read the shards back through Kombu; the last ones run real
workers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import billiard
import pytest
import redis
from harness import FAST_RESTORE, intervals, wait_until

from celery_fair import fair_headers
from celery_fair.core.lanes import DEFAULT_LANES, HeavyKeys, LaneMap, LaneTable
from celery_fair.protocol import lane_name
from celery_fair.redis_broker import redis_broker_client, redis_queue_lists
from celery_fair.routing import DEFAULT_SHARDS, Lanes, shard_name, shard_of
from celery_fair.worker.intake import BATCH, RedisIntake, plain_consumers
from celery_fair.worker.intake.amqp import AmqpIntake

SHARDS = DEFAULT_SHARDS


@pytest.fixture
def redis_run(make_run):
    def make(**conf):
        return make_run(conf=conf)

    return make


@contextlib.contextmanager
def intake_for(run):
    """The intake a worker of ``run`` would run."""
    if run.broker == "redis":
        with run.app.connection_for_write() as conn:
            channel = conn.default_channel
            intake = RedisIntake(redis_broker_client(channel), redis_queue_lists(channel), SHARDS)
            try:
                yield intake
            finally:
                intake.close()
    else:
        intake = AmqpIntake(run.app)
        try:
            yield intake
        finally:
            intake.close()


def drain(run, queue):
    """Every message in ``queue``, oldest first, as (fairness_key, tag, priority)."""
    out = []
    with run.app.connection_for_read() as conn:
        simple = conn.SimpleQueue(queue)
        while True:  # not qsize(): Kombu's passive declare misses prefixed Redis lists
            try:
                message = simple.get(timeout=0.2)
            except simple.Empty:
                break
            headers = message.headers or {}
            args = json.loads(message.body)[0] if message.body else [None]
            out.append((headers.get("fairness_key"), args[0], message.properties.get("priority")))
            message.ack()
        simple.close()
    return out


def test_the_intake_puts_each_message_in_the_shard_the_producer_side_would(redis_run):
    run = redis_run()
    keys = [f"client-{i}" for i in range(150)] + [
        "ü-client",
        "a" * 200,
        'with "quotes"',
        "10.0.0.7",
    ]
    for key in keys:
        run.send("fairapp.clone", key, headers=fair_headers("clone", key))
    with intake_for(run) as intake:
        assert intake.drain([run.queue]) == len(keys)
    assert drain(run, run.queue) == []
    seen = []
    for i in range(SHARDS):
        for key, tag, _ in drain(run, shard_name(run.queue, i)):
            assert shard_of(key, SHARDS) == i, key
            seen.append(tag)
    assert sorted(seen) == sorted(keys)


def test_what_is_not_a_keyed_fair_job_stays_in_order_and_priorities_are_kept(redis_run):
    run = redis_run()
    sent = []
    for i in range(30):
        if i % 3 == 0:
            run.send("fairapp.plain", f"plain-{i}")
            sent.append(("stay", f"plain-{i}"))
        elif i % 3 == 1:
            run.send("fairapp.clone", f"bg-{i}", headers=fair_headers("clone"))  # no key
            sent.append(("stay", f"bg-{i}"))
        else:
            run.send("fairapp.clone", f"k-{i}", headers=fair_headers("clone", "k"), priority=9)
            sent.append(("move", f"k-{i}"))
    with intake_for(run) as intake:
        moved, looked = intake.move(run.queue, batch=1000)
    assert (moved, looked) == (10, 30)
    assert [tag for _, tag, _ in drain(run, run.queue)] == [t for w, t in sent if w == "stay"]
    shard = drain(run, shard_name(run.queue, shard_of("k", SHARDS)))
    assert [(tag, pri) for _, tag, pri in shard] == [(t, 9) for w, t in sent if w == "move"]


class FakeLanes:
    """``routing.Lanes`` as the intake uses it: the map it knows, and asking for a lane."""

    def __init__(self, lanes: dict[str, int], give: int | None) -> None:
        self.heavy = HeavyKeys(threshold=16)
        self.map = dict(lanes)
        self.give = give
        self.asked: list[str] = []

    def current(self) -> LaneMap:
        return LaneMap(1, dict(self.map), 4)

    def ask(self, key: str) -> int | None:
        self.asked.append(key)
        if self.give is not None:
            self.map[key] = self.give
        return self.give


@pytest.mark.parametrize("broker", ["redis"])
@pytest.mark.parametrize("give", [3, None])
def test_the_redis_intake_moves_laned_keys_to_their_lanes_and_asks_before_a_burst_lands(
    redis_run, give
):
    # Given, in the queue itself, a burst of 40 of B's (no lane yet), 3 of A's (lane 2) and 5
    # of C's (light), interleaved,
    run = redis_run()
    sent: dict[str, list[str]] = {"A": [], "B": [], "C": []}
    for i in range(48):
        key = "A" if i % 16 == 0 else "C" if i % 16 in (1, 9) and len(sent["C"]) < 5 else "B"
        run.send("fairapp.clone", f"{key}{i}", headers=fair_headers("clone", key))
        sent[key].append(f"{key}{i}")
    lanes = FakeLanes({"A": 2}, give)
    # when the intake moves them,
    with run.app.connection_for_write() as conn:
        channel = conn.default_channel
        intake = RedisIntake(
            redis_broker_client(channel), redis_queue_lists(channel), SHARDS, lanes, 4
        )
        try:
            assert intake.move(run.queue, batch=BATCH) == (48, 48)
        finally:
            intake.close()
    # then B, heavy among them, was given a lane before any of it moved, and went there (or,
    # with no lane to be had, to its shard), A to its lane, C to its shard, each in order.
    assert lanes.asked == ["B"]
    tags = lambda queue: [tag for _, tag, _ in drain(run, queue)]  # noqa: E731
    assert tags(lane_name(run.queue, 2)) == sent["A"]
    b_shard, c_shard = (shard_name(run.queue, shard_of(k, SHARDS)) for k in "BC")
    assert b_shard != c_shard  # (this test's keys)
    assert tags(lane_name(run.queue, 3) if give is not None else b_shard) == sent["B"]
    assert tags(c_shard) == sent["C"]
    assert drain(run, run.queue) == []


@pytest.mark.parametrize("broker", ["redis"])
def test_stragglers_leave_their_shard_for_the_front_of_their_lanes_in_order(redis_run):
    # Given, in one shard, stragglers of A (lane 2) and B (lane 1) at two priorities, among a
    # light key's messages and a plain task's, and A's lane holding a newer message already,
    run = redis_run()
    shard = shard_name(run.queue, 5)
    sent: list[tuple[str, str, int]] = []
    for i in range(40):
        key = ("A", "B", "C", "")[i % 4]
        priority = 9 if i % 5 == 0 else 0
        if key:
            run.app.send_task(
                "fairapp.clone", [f"{key}{i}"], headers=fair_headers("clone", key),
                queue=shard, priority=priority,
            )  # fmt: skip
        else:
            run.app.send_task("fairapp.plain", [f"p{i}"], queue=shard, priority=priority)
        sent.append((key, f"{key or 'p'}{i}", priority))
    run.app.send_task(
        "fairapp.clone", ["A-new"], headers=fair_headers("clone", "A"),
        queue=lane_name(run.queue, 2),
    )  # fmt: skip
    lanes = FakeLanes({"A": 2, "B": 1}, None)
    # when the intake reroutes the shard,
    with run.app.connection_for_write() as conn:
        channel = conn.default_channel
        intake = RedisIntake(
            redis_broker_client(channel), redis_queue_lists(channel), SHARDS, lanes, 4
        )
        try:
            assert intake.reroute(shard) == (20, 40)
            assert intake.reroute(shard) == (0, 20)  # nothing more to move
            # and again once a producer that routes A by hash (an older release) sent more,
            for i in range(3):
                run.app.send_task(
                    "fairapp.clone", [f"A-late{i}"], headers=fair_headers("clone", "A"),
                    queue=shard,
                )  # fmt: skip
            assert intake.reroute(shard) == (3, 23)
        finally:
            intake.close()

    def popped(*keys: str) -> list[str]:
        # Kombu's Redis transport pops step by step, priority 0's list first, oldest first.
        return [tag for p in (0, 9) for k, tag, q in sent if k in keys and q == p]

    # then the shard keeps the rest in its order, and each lane pops its key's stragglers
    # first, oldest first, each in its priority step, before the message that was there; the
    # late ones go behind everything (A's first stragglers still wait at the lane's front),
    # so that stragglers keep their order among themselves.
    assert [tag for _, tag, _ in drain(run, shard)] == popped("C", "")
    assert [tag for _, tag, _ in drain(run, lane_name(run.queue, 1))] == popped("B")
    a_first = [tag for k, tag, p in sent if k == "A" and p == 0]  # "A-new" is of step 0 too
    a_last = [tag for k, tag, p in sent if k == "A" and p == 9]
    assert [tag for _, tag, _ in drain(run, lane_name(run.queue, 2))] == [
        *a_first,
        "A-new",
        "A-late0",
        "A-late1",
        "A-late2",
        *a_last,
    ]


def test_a_call_looks_at_no_more_than_its_batch_and_the_rest_waits_for_the_next(redis_run):
    run = redis_run()
    for i in range(25):
        run.send("fairapp.clone", f"k-{i}", headers=fair_headers("clone", f"k{i}"))
    with intake_for(run) as intake:
        if run.broker == "redis":  # one script call takes exactly what it looks at
            assert intake.move(run.queue, batch=10) == (10, 10)
            assert intake.move(run.queue, batch=10) == (10, 10)
            assert intake.move(run.queue, batch=10) == (5, 5)
            # An empty queue costs no call of the script (it names every shard and lane),
            calls: list[int] = []
            script = intake._move
            intake._move = lambda **kw: calls.append(1) or script(**kw)
            assert intake.move(run.queue, batch=10) == (0, 0)
            assert calls == []
            # and what is published next is moved by the next call.
            run.send("fairapp.clone", "k-late", headers=fair_headers("clone", "k-late"))
            assert intake.move(run.queue, batch=10) == (1, 1)
            assert calls == [1]
            return
        # RabbitMQ: a pass works on the deliveries that reached it within DELIVERY_WAIT of
        # each other, so a loaded host may see fewer per pass, never more than the batch.
        passes: list[tuple[int, int]] = []

        def all_moved() -> bool:
            passes.append(intake.move(run.queue, batch=10))
            return sum(moved for moved, _ in passes) >= 25

        wait_until(all_moved, 20, "the 25 messages moved", show=lambda: passes)
        assert all(moved == looked <= 10 for moved, looked in passes), passes
        assert sum(moved for moved, _ in passes) == 25, passes
        assert intake.move(run.queue, batch=10) == (0, 0)


def test_a_newcomer_published_to_the_queue_right_after_a_burst_waits_behind_few(
    make_run, start_worker
):
    # Given a producer that knows nothing of shards: client A's 3,000 jobs and then client B's
    # two all go to the queue itself (A's of 100 ms: what B waits for is the intake's time,
    # counted in A's starts, so 20 ms jobs made it 12 of them when CI's load slowed Redis),
    run = make_run()
    start_worker(run, concurrency=2)
    burst = 3000
    for i in range(burst):
        run.send("fairapp.clone", f"A{i}", 0.1, headers=fair_headers("clone", "A"))
    published = time.time()
    for i in range(2):
        run.send("fairapp.clone", f"B{i}", 0.02, headers=fair_headers("clone", "B"))
    # then the worker's intake moves them into their shards, and B starts once the intake has
    # moved what was ahead of it: behind few of A's on Redis (a script moves 500 in a few
    # milliseconds); on RabbitMQ, behind those the pool ran while the intake republished the
    # queue's backlog (about 4,000 a second here; without an intake, B waits behind most of
    # the burst).
    wait_until(lambda: all(run.recorder.done_counts().get(f"B{i}") for i in range(2)), 60, "B")
    spans = intervals(run.recorder.events())
    b_started = max(spans[f"B{i}"][0] for i in range(2))
    a_starts = [s for t, (s, _) in spans.items() if t.startswith("A")]
    a_between = [s for s in a_starts if published < s < b_started]
    bound = 10 if run.broker == "redis" else burst // 5
    assert len(a_between) <= bound, (len(a_between), b_started - published)


def test_a_worker_killed_while_its_intake_moves_loses_nothing(make_run, start_worker):
    # Given a worker whose window is full of long acks_late jobs (it takes nothing more in:
    # Kombu's Redis transport loses a message popped by a worker killed before it records it,
    # with or without celery-fair, and this test is about the intake),
    run = make_run(conf={"broker_transport_options": dict(FAST_RESTORE), "fair_max_held": 20})
    first = start_worker(run, concurrency=2)
    for i in range(30):
        # (long enough to outlast the kill however slow the machine: a job that ended on the
        # first worker with its ack not yet sent would run again, as acks_late jobs do, and
        # CI once saw that)
        run.send("fairapp.late", f"long{i}", 60.0, headers=fair_headers("late", f"k{i % 7}"))
    wait_until(lambda: len(starts(run)) == 2, 20, "two long jobs to run")
    # while its intake moves the queue's backlog into the shards, message after message,
    stop = threading.Event()

    def publish():
        for i in range(SHORT):
            if stop.is_set():
                return
            run.send("fairapp.late", f"short{i}", 0.001, headers=fair_headers("late", f"k{i % 7}"))

    publisher = threading.Thread(target=publish)
    publisher.start()
    try:
        wait_until(lambda: moved_so_far(run) >= 300, 30, "the intake to move some")
        # when the worker is SIGKILLed,
        first.kill()
        ended = {e["tag"] for e in run.recorder.events() if e["event"] == "end"}
    finally:
        publisher.join()
    # then another worker runs every job: on Redis, a job runs twice only if its run ended on
    # the first worker before the kill (acks_late: its ack may not have reached Redis; none
    # here, its jobs outlast the kill), else exactly once, since a script call moves its
    # messages atomically (what Kombu's own gap loses is kept out: the first worker took
    # nothing in); on RabbitMQ at least once, and a job runs twice only if the killed intake
    # had its copy confirmed but not its original acknowledged (one batch).
    start_worker(run, concurrency=2, env={"FAIRAPP_SLEEP_CAP": "0.01"})
    wait_until(lambda: len(run.recorder.done_counts()) == 30 + SHORT, 120, "every job")
    runs = run.recorder.done_counts()
    if run.broker == "redis":
        assert {tag for tag, n in runs.items() if n > 1} <= ended
    else:
        assert sum(n - 1 for n in runs.values()) <= BATCH


@pytest.mark.parametrize("broker", ["redis"])
def test_an_intake_killed_while_it_reroutes_stragglers_loses_and_copies_nothing(redis_run):
    # Given an intake that reroutes A's stragglers (A has lane 1) out of A's shard, call after
    # call, while a producer that routes by hash publishes A and a light key C to that shard
    # (nothing reads it: C's messages pile up at its oldest end, 250 by the kill, short of
    # the 500 a call looks at),
    run = redis_run()
    shard = shard_name(run.queue, shard_of("A", SHARDS))
    loop = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("reroute_loop.py")), shard, "A", "1"],
        env=run.env(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, stopped by its PID
    )
    try:
        assert loop.stdout is not None
        assert loop.stdout.readline().strip() == "ready"
        sent = []
        for i in range(2000):
            key = "C" if i % 4 == 3 else "A"
            run.app.send_task(
                "fairapp.clone", [f"{key}{i:04d}"], headers=fair_headers("clone", key),
                queue=shard,
            )  # fmt: skip
            sent.append(f"{key}{i:04d}")
            if i == 1000:
                # when it is SIGKILLed mid-stream,
                wait_until(lambda: lane_length(run, 1) > 300, 20, "the intake to move some")
                os.killpg(loop.pid, signal.SIGKILL)
    finally:
        if loop.poll() is None:
            os.killpg(loop.pid, signal.SIGKILL)
        loop.wait(10)
        if loop.stdout is not None:
            loop.stdout.close()
    # then every message is in the shard or A's lane exactly once, C's all in the shard, and
    # A's in order: those moved first, then those left in the shard.
    lane = [tag for _, tag, _ in drain(run, lane_name(run.queue, 1))]
    left = [tag for _, tag, _ in drain(run, shard)]
    assert sorted(lane + left) == sorted(sent)
    assert all(tag.startswith("A") for tag in lane)
    assert len(lane) > 300
    a_left = [tag for tag in left if tag.startswith("A")]
    assert lane + a_left == [tag for tag in sent if tag.startswith("A")]
    assert [tag for tag in left if tag.startswith("C")] == [t for t in sent if t.startswith("C")]


def lane_length(run, lane: int) -> int:
    client = redis.Redis.from_url(run.url)
    try:
        return int(client.llen(f"{run.prefix}:{lane_name(run.queue, lane)}"))
    finally:
        client.close()


SHORT = 2000
SHORT = 2000


def starts(run):
    return [e for e in run.recorder.events() if e["event"] == "start"]


def moved_so_far(run) -> int:
    """Messages in the run's shards and lanes now (only the intake puts them there in this
    test; with a store, a key with many messages in one move goes to its lane)."""
    shards = [shard_name(run.queue, i) for i in range(SHARDS)]
    if run.broker == "redis":  # (the store: the broker's Redis; none on RabbitMQ here)
        shards += [lane_name(run.queue, j) for j in range(DEFAULT_LANES)]
    if run.broker == "amqp":
        with run.app.connection_for_read() as conn:
            channel = conn.default_channel
            return sum(channel.queue_declare(q, passive=True).message_count for q in shards)
    client = redis.Redis.from_url(run.url)
    try:
        return sum(client.llen(f"{run.prefix}:{q}") for q in shards)
    finally:
        client.close()


class TableStore:
    """The shared store's lane calls over one ``LaneTable`` (the memory store's rule): the
    producer's side of it, without a fleet to announce lanes."""

    def __init__(self) -> None:
        self.table = LaneTable(size=4)

    def lanes(self, version: int) -> LaneMap | None:
        found = self.table.map()
        return None if found.version == version else found

    def ask_lane(self, fairness_key: str) -> int | None:
        return self.table.ask(fairness_key, time.monotonic())

    def renew_lanes(self, keys) -> None:
        self.table.renew(keys, time.monotonic())


@pytest.mark.parametrize("broker", ["redis"])
def test_a_producer_that_gives_a_key_its_lane_first_moves_its_messages_left_in_its_shard(
    redis_run,
):
    # Given a producer with lanes on a Redis broker (threshold 4), and in key A's shard, ahead
    # of anything A publishes, two stragglers of B (B has lane 0 now, an older producer left
    # them there),
    run = redis_run(fair_lane_threshold=4)
    lanes = Lanes.of(run.app)
    store = lanes._store = TableStore()
    lanes._opened = True
    shard = shard_name(run.queue, shard_of("A", SHARDS))
    keys = (f"k{i}" for i in range(400))
    b, light = [k for k in keys if shard_of(k, SHARDS) == shard_of("A", SHARDS)][:2]
    assert store.ask_lane(b) == 0
    for i in range(2):
        run.app.send_task(
            "fairapp.clone", [f"{b}-{i}"], headers=fair_headers("clone", b), queue=shard
        )
    # when A publishes 4 jobs (to its shard), a light key in A's shard one, and A 6 more (A
    # turns heavy at its fifth, within a second: it gets lane 1),
    clone = run.app.tasks["fairapp.clone"]
    for i in range(4):
        clone.apply_async([f"A{i}"], fairness_key="A")
    clone.apply_async(["light"], fairness_key=light)
    for i in range(4, 10):
        clone.apply_async([f"A{i}"], fairness_key="A")
    # then the publish that gave A its lane moved A's four from the shard to the lane's
    # consuming end before it went there: A's lane holds all ten in the order A published
    # them; B's two went to B's lane; only the light key's message waits in the shard.
    assert lanes.map.lane_of("A") == 1
    tags = lambda queue: [tag for _, tag, _ in drain(run, queue)]  # noqa: E731
    assert tags(lane_name(run.queue, 1)) == [f"A{i}" for i in range(10)]
    assert tags(lane_name(run.queue, 0)) == [f"{b}-0", f"{b}-1"]
    assert tags(shard) == ["light"]
    assert lanes.rerouted == 6


def _brpop_clients(client: redis.Redis) -> set[int]:
    return {c["id"] for c in client.client_list() if c.get("cmd") == "brpop"}


@pytest.mark.parametrize("broker", ["redis"])
def test_a_process_the_pool_starts_while_the_intake_asks_for_the_workers_queues_comes_up(
    make_run,
):
    # Given the intake's look for plain workers waiting for their replies on its thread (no
    # worker answers here, so it waits its whole timeout with a reply read in flight),
    run = make_run()
    client = redis.Redis.from_url(run.url)
    before = _brpop_clients(client)
    asking = threading.Thread(
        target=plain_consumers, args=(run.app, [run.queue]), kwargs={"timeout": 3.0}, daemon=True
    )
    asking.start()
    wait_until(lambda: _brpop_clients(client) - before, 10, "the look's reply read")
    # When the prefork pool starts processes meanwhile, one after another (billiard runs the
    # after-fork hooks, which close the connections of every Kombu pool in a new process),
    exits = []
    for _ in range(3):
        process = billiard.Process(target=int, daemon=True)
        process.start()
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)
            exits.append("hung")
        else:
            exits.append(process.exitcode)
    still_asking = asking.is_alive()
    asking.join(15)
    # Then each comes up at once: nothing in it waits on a socket the parent reads (when the
    # look asked over a pooled connection, a new process that lost the race for the reply
    # hung until it was killed: 9 of 10 in a probe),
    assert exits == [0, 0, 0]
    assert still_asking  # all while the look was asking
