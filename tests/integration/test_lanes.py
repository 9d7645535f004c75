"""Lanes with real workers (issue 33): a key that turns heavy goes to a queue of its own, so a
light client whose key shares the heavy key's shard waits behind no more than the heavy key's
first few messages, on both brokers; the lanes are the store's, given only once the workers
consume them."""

from __future__ import annotations

import json
import threading
import time

import pytest
from fairapp import make_app
from harness import (
    FAST_RESTORE,
    gate_stats,
    intervals,
    node,
    queue_length,
    wait_until,
    wait_until_recorded_by_the_broker,
)

from celery_fair import fair_headers
from celery_fair.core.lanes import DEFAULT_THRESHOLD
from celery_fair.protocol import shard_name
from celery_fair.routing import Lanes, shard_of
from celery_fair.store import RedisStore

STORE = "redis://127.0.0.1:6379/3"  # the store on RabbitMQ (on Redis: the broker's)
SLOTS = 2
SHARDS = 8


def lane_conf(broker: str) -> dict:
    return {"fair_store_url": STORE} if broker == "amqp" else {}


def store_of(run) -> RedisStore:
    url = run.conf.get("fair_store_url", run.url)
    return RedisStore.from_url(url, prefix=run.conf["fair_store_prefix"])


def colliding(heavy: str, count: int) -> list[str]:
    """``count`` keys that the product's own shard function puts in ``heavy``'s shard."""
    keys, i = [], 0
    while len(keys) < count:
        key = f"light-{i}"
        if shard_of(key, SHARDS) == shard_of(heavy, SHARDS):
            keys.append(key)
        i += 1
    return keys


def light_right_after(clone, heavy: str, count: int, seconds: float = 0.02):
    """``count`` light clients whose keys share ``heavy``'s shard publish one job each, now;
    when they published, and their keys."""
    published = time.time()
    light = colliding(heavy, count)
    for key in light:
        clone.apply_async([key, seconds], fairness_key=key)
    return published, light


def lane_world(make_run, start_worker, broker):
    """A run with one fair worker that has told the shared store it consumes lanes, that
    store, and the worker."""
    run = make_run(conf=lane_conf(broker))
    worker = start_worker(run, concurrency=SLOTS)
    store = store_of(run)
    wait_until(lambda: store.lanes(-1).size > 0, 30, "the worker to announce its lanes")
    return run, store, worker


def heavy_starts_before_the_light(
    run, published: float, light: list[str], heavy: str = "A"
) -> list[str]:
    """Once every light client's job has run: the jobs of ``heavy`` (recorded as
    ``<heavy><i>``) that started after ``published`` and before the last light client's
    start."""
    done = run.recorder.done_counts
    wait_until(lambda: all(done().get(key) for key in light), 60, "the light clients' jobs")
    spans = intervals(run.recorder.events())
    last_light = max(spans[key][0] for key in light)
    return [t for t, (s, _) in spans.items() if t.startswith(heavy) and published < s < last_light]


def test_a_worker_that_reads_the_shards_but_not_the_lanes_is_warned_about(
    make_run, start_worker, broker
):
    # Given a fair worker with lanes, and beside it one that reads no lanes (on RabbitMQ one
    # without the shared store, on Redis one with fair_lanes = 0),
    run, store, lanes = lane_world(make_run, start_worker, broker)
    if broker == "amqp":
        conf = {k: v for k, v in run.conf.items() if k != "fair_store_url"}
    else:
        conf = {**run.conf, "fair_lanes": 0}
    laneless = start_worker(run, concurrency=1, env={"FAIRAPP_CONF": json.dumps(conf)})
    # then the worker with lanes warns, naming it and no other,
    warning = f"{node(laneless)} consume(s) the shards of queue {run.queue!r} but not its lanes"
    wait_until(lambda: warning in lanes.log(), 30, "the warning in the lane worker's log")
    (line,) = [x for x in lanes.log().splitlines() if "but not its lanes" in x]
    assert node(lanes) not in line
    store.close()


def test_light_clients_in_a_heavy_keys_shard_start_behind_only_its_first_messages(
    make_run, start_worker, broker
):
    # Given a fair worker with a shared store, which has told the store it consumes lanes,
    run, store, _ = lane_world(make_run, start_worker, broker)
    clone = run.app.tasks["fairapp.clone"]
    # when client A publishes a burst of 1,500 jobs, and right after, 8 light clients whose
    # keys hash to A's shard publish one job each (the burst mostly still in the broker),
    for i in range(1500):
        clone.apply_async([f"A{i}", 0.02], fairness_key="A")
    published, light = light_right_after(clone, "A", 8)
    # then A got a lane of its own, and the light clients all started behind no more of A's
    # jobs than the ones A published before it turned heavy, and what the worker held then
    # (without lanes: about 1,400, the whole burst ahead of them in the shard).
    assert store.lanes(-1).lane_of("A") is not None
    assert not any(store.lanes(-1).lane_of(key) is not None for key in light)
    a_between = heavy_starts_before_the_light(run, published, light)
    assert len(a_between) <= DEFAULT_THRESHOLD + 4 * (SLOTS + 2), len(a_between)
    store.close()


# On RabbitMQ the worker takes the queue's messages itself while it has room, up to
# fair_max_held, and the intake only the rest: what a light client waits for there is the
# intake's (test_intake.py), lanes or not. So this is Redis's, where the intake moves first.
@pytest.mark.parametrize("broker", ["redis"])
def test_through_the_intake_a_heavy_key_gets_its_lane_before_its_burst_fills_a_shard(
    make_run, start_worker, broker
):
    # Given a fair worker with a shared store and lanes, and producers that know nothing of
    # celery-fair: every job goes to the queue itself, and the worker's intake moves it,
    run, store, _ = lane_world(make_run, start_worker, broker)
    # when client A sends a burst of 1,500 and 8 light clients in A's shard one job each,
    for i in range(1500):
        run.send("fairapp.clone", f"A{i}", 0.02, headers=fair_headers("clone", "A"))
    published = time.time()
    light = colliding("A", 8)
    for key in light:
        run.send("fairapp.clone", key, 0.02, headers=fair_headers("clone", key))
    # then the intake asked for A's lane before it moved A's burst, which went there, and the
    # light clients started behind few of A's jobs.
    a_between = heavy_starts_before_the_light(run, published, light)
    assert store.lanes(-1).lane_of("A") is not None
    assert len(a_between) <= DEFAULT_THRESHOLD + 4 * (SLOTS + 2), (len(a_between), store.lanes(-1))
    store.close()


def rule_share(
    before: dict[str, int], backlog: dict[str, int], starts: int, key: str, wins_ties: bool
) -> list[int]:
    """What flat fairness gives ``key`` of the next ``starts`` starts when every job costs the
    same: each start goes to a backlogged key with the fewest starts so far (``before``: each
    key's starts so far; ``backlog``: its jobs not started), ``key`` first among equals if it
    ``wins_ties``, else last. Element n: ``key``'s starts among the first n + 1.

    >>> rule_share({"a": 2, "b": 0}, {"a": 3, "b": 3}, 4, "b", True)
    [1, 2, 3, 3]
    >>> rule_share({"a": 2, "b": 0}, {"a": 3, "b": 3}, 4, "b", False)
    [1, 2, 2, 3]
    """
    counts, left, out = dict(before), dict(backlog), []
    for _ in range(starts):
        open_ = [k for k in left if left[k] > 0]
        pick = min(open_, key=lambda k: (counts.get(k, 0), (k != key) == wins_ties))
        counts[pick] = counts.get(pick, 0) + 1
        left[pick] -= 1
        out.append(counts.get(key, 0))
    return out


def test_a_tenant_on_ten_keys_leaves_a_one_key_tenant_the_share_of_one_key_in_eleven(
    make_run, start_worker, broker
):
    # Given a fair worker of 4 slots with lanes, tenant T's backlog on ten keys nobody chose
    # for their hash (so several share a shard, and the one-key tenant's shard too), and
    # right after, the one-key tenant's backlog (jobs that cost what their type says from the
    # first on: the rule's share is then a count of starts; 100 ms, so that a slot frees every
    # 25 ms: with 40 ms jobs, a slot every 10 ms, a loaded host's worker is still reading the
    # one-key tenant's next message when the slot it was owed goes to what is in hand),
    run = make_run(conf=lane_conf(broker))
    start_worker(run, concurrency=4)
    store = store_of(run)
    wait_until(lambda: store.lanes(-1).size > 0, 30, "the worker to announce its lanes")
    even = run.app.tasks["fairapp.even"]
    tenant = [f"t-{i}" for i in range(10)]
    for i in range(40):
        for key in tenant:
            even.apply_async([f"{key}/{i}", 0.1], fairness_key=key)
    published = time.time()
    for i in range(50):
        even.apply_async([f"solo/{i}", 0.1], fairness_key="solo")
    done = run.recorder.done_counts
    wait_until(lambda: len(done()) == 450, 60, "every job")
    spans = intervals(run.recorder.events())
    starts = sorted((s, tag) for tag, (s, _) in spans.items())
    # (the rule can serve the one-key tenant only once its first message has reached the
    # worker: a few of T's starts come in between, the broker's delivery, not the rule; the
    # rule is checked from its first start on)
    came = next(s for s, tag in starts if tag.startswith("solo/"))
    between = [tag for s, tag in starts if published <= s < came]
    assert len(between) <= 8, between
    before: dict[str, int] = {}
    for s, tag in starts:
        if s < came:
            before[tag.split("/")[0]] = before.get(tag.split("/")[0], 0) + 1
    after = [tag for s, tag in starts if s >= came]  # whose start each was, in order
    # then from the moment it published, the one-key tenant gets what flat fairness gives it
    # at every point until its jobs run out: every start to a key with the fewest starts, so
    # first the few it needs to catch up with T's keys (they started before it came), then
    # one start in eleven; give or take the jobs that start together on the pool's four
    # processes and the order of ties (before lanes its jobs waited in their shard behind
    # T's: 0 of the first 110 starts);
    backlog = {key: 40 - before.get(key, 0) for key in tenant} | {"solo": 50}
    most = rule_share(before, backlog, len(after), "solo", wins_ties=True)
    least = rule_share(before, backlog, len(after), "solo", wins_ties=False)
    solo = 0
    for n, tag in enumerate(after[: after.index("solo/49") + 1]):
        solo += tag.startswith("solo/")
        assert least[n] - 4 <= solo <= most[n] + 4, (n, solo, least[n], most[n], after[: n + 1])
    # and its jobs start in the order it published them (its first 16 waited in its shard,
    # behind T's, when the 17th went to its lane), give or take the pool's four processes.
    order = [int(tag.split("/")[1]) for tag in after if tag.startswith("solo/")]
    assert max(abs(position - i) for position, i in enumerate(order)) <= 4, order
    store.close()


def test_a_key_no_producer_finds_heavy_gets_its_lane_from_the_worker_it_crowds(
    make_run, start_worker, broker
):
    # Given producers that never find a key heavy (many processes each publishing below the
    # threshold, as one with an unreachable threshold stands for here), and a fair worker
    # with a shared store and lanes,
    run = make_run(conf={**lane_conf(broker), "fair_lane_threshold": 10**9})
    worker = start_worker(run, concurrency=SLOTS)
    store = store_of(run)
    wait_until(lambda: store.lanes(-1).size > 0, 30, "the worker to announce its lanes")
    clone = run.app.tasks["fairapp.clone"]
    # when key H streams 100 ms jobs at 40 a second, twice what the worker runs,
    streaming = threading.Event()
    stop = threading.Event()

    def stream() -> None:
        streaming.set()
        at = time.monotonic()
        for i in range(2000):
            clone.apply_async([f"H{i}", 0.1], fairness_key="H")
            at += 0.025
            if stop.wait(max(0.0, at - time.monotonic())):
                break
        streaming.clear()

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        # then the worker finds H crowding its shard and asks for H's lane; the producers
        # route H there from their next read of the map,
        wait_until(lambda: store.lanes(-1).lane_of("H") is not None, 20, "the worker's ask")
        assert gate_stats(run, worker)["fair-lanes-asked"] >= 1
        lanes = Lanes.of(run.app)
        wait_until(lambda: lanes.map.lane_of("H") is not None, 20, "the producer to use it")
        # so H's shard drains while H streams on (without the lane it grows, 20 a second),
        shard = shard_name(run.queue, shard_of("H", SHARDS))
        wait_until(lambda: queue_length(run, shard) == 0, 30, "H's shard to drain")
        assert streaming.is_set()
        # and light clients in H's shard start behind few of H's jobs, not H's backlog.
        published, light = light_right_after(clone, "H", 4, 0.1)
        h_between = heavy_starts_before_the_light(run, published, light, heavy="H")
        assert streaming.is_set()
        assert len(h_between) <= 2 * (SLOTS + 2), len(h_between)
    finally:
        stop.set()
        thread.join(10)
    store.close()


def test_a_key_that_turns_heavy_mid_burst_keeps_its_order_and_light_keys_their_place(
    make_run, start_worker, broker
):
    # Given a fair worker with a shared store and lanes,
    run, store, _ = lane_world(make_run, start_worker, broker)
    clone = run.app.tasks["fairapp.clone"]
    # when client A publishes ten jobs at five a second (light: they go to its shard), then a
    # burst of 1,000 at full speed (it turns heavy at the 17th within a second: the rest go to
    # its lane), and light clients in A's shard publish right after,
    tick = threading.Event()
    for i in range(10):
        clone.apply_async([f"A{i:04d}", 0.02], fairness_key="A")
        tick.wait(0.2)  # the client's own pace, not a wait for a result
    for i in range(10, 1010):
        clone.apply_async([f"A{i:04d}", 0.02], fairness_key="A")
    published, light = light_right_after(clone, "A", 4)
    # then A got its lane mid-burst, the light clients start behind few of A's jobs,
    assert store.lanes(-1).lane_of("A") is not None
    a_between = heavy_starts_before_the_light(run, published, light)
    assert len(a_between) <= DEFAULT_THRESHOLD + 4 * (SLOTS + 2), len(a_between)
    # and A's jobs start in the order A published them: its messages left in the shard (the
    # ones before its lane) come before those in its lane, give or take the jobs that start
    # together on the pool's processes.
    wait_until(lambda: run.recorder.done_counts().get("A1009"), 60, "A's last job")
    spans = intervals(run.recorder.events())
    started = sorted((spans[f"A{i:04d}"][0], i) for i in range(1010))
    order = [i for _, i in started]
    out_of_place = max(abs(position - i) for position, i in enumerate(order))
    assert out_of_place <= SLOTS, order[:60]
    store.close()


def test_many_producers_bursting_one_key_leave_light_clients_behind_few_of_its_jobs(
    make_run, start_worker, broker
):
    # Given a fair worker with a shared store and lanes, and eight producer processes (each
    # an app of its own, which counts its own publishes),
    run, store, worker = lane_world(make_run, start_worker, broker)
    producers = [make_app(run.url, run.queue, run.prefix, conf=run.conf) for _ in range(8)]
    clones = [app.tasks["fairapp.clone"] for app in producers]
    # when each publishes a burst of 100 jobs of 100 ms of key A at once (each sends its first
    # 16 to A's shard before it finds A heavy: 128 there, ahead of light keys), and light
    # clients in A's shard publish right after,
    try:
        for i in range(100):
            for p, clone in enumerate(clones):
                clone.apply_async([f"A{p}-{i}", 0.1], fairness_key="A")
        published, light = light_right_after(clones[0], "A", 4, 0.1)
        # then the worker gets past A's messages left in its shard (RabbitMQ: it reads on past
        # them, consumer_prefetch.py; Redis: its intake moves them to the head of A's lane),
        # so they wait in A's share like the rest of A's burst, not ahead of the light keys,
        # and the light clients start behind few of A's jobs (taken in only as they start,
        # the 128 would all start first).
        a_between = heavy_starts_before_the_light(run, published, light)
        assert len(a_between) <= DEFAULT_THRESHOLD + 4 * (SLOTS + 2), len(a_between)
        if broker == "redis":
            assert gate_stats(run, worker)["fair-rerouted"] > 0
    finally:
        for app in producers:
            app.close()
    store.close()


def test_a_worker_killed_holding_a_keys_lane_and_stragglers_loses_nothing(
    make_run, start_worker, broker
):
    # Given a fair worker with lanes (short leases and, on Redis, a short ack timeout),
    conf = {**lane_conf(broker), "fair_lease_seconds": 3}
    if broker == "redis":
        conf["broker_transport_options"] = dict(FAST_RESTORE)
    run = make_run(conf=conf)
    first = start_worker(run, concurrency=2)
    store = store_of(run)
    wait_until(lambda: store.lanes(-1).size > 0, 30, "the worker to announce its lanes")
    # and key A's 40 acks_late jobs on one repository (one runs at a time, so the worker takes
    # all the others in): A turns heavy at its 17th, so 16 wait in its shard, the rest in its
    # lane,
    locked = run.app.tasks["fairapp.locked"]
    for i in range(40):
        locked.apply_async([f"A{i}", 5.0], fairness_key="A", job_id="repo")
    assert store.lanes(-1).lane_of("A") is not None
    wait_until(lambda: gate_stats(run, first).get("fair-lanes-held"), 20, "A's lane held")
    wait_until(lambda: gate_stats(run, first).get("fair-stragglers-held"), 20, "its stragglers")
    wait_until(lambda: gate_stats(run, first)["fair-held"] == 39, 20, "the rest held")
    wait_until_recorded_by_the_broker(run, 40)  # none on its way when the worker goes
    # when the worker is SIGKILLed mid-job,
    first.kill()
    ended = {e["tag"] for e in run.recorder.events() if e["event"] == "end"}
    # then another worker runs every job, from the shard and the lane alike, and none twice
    # but one whose first run had ended before the kill (acks_late).
    start_worker(run, concurrency=2, env={"FAIRAPP_SLEEP_CAP": "0.01"})
    wait_until(lambda: len(run.recorder.done_counts()) == 40, 120, "every job")
    runs = run.recorder.done_counts()
    assert set(runs) == {f"A{i}" for i in range(40)}
    assert {tag for tag, n in runs.items() if n > 1} <= ended
    store.close()


def test_five_heavy_clients_on_three_workers_leave_every_light_client_behind_few_of_theirs(
    make_run, start_worker, broker
):
    # Given three fair workers with lanes,
    run = make_run(conf=lane_conf(broker))
    for _ in range(3):
        start_worker(run, concurrency=SLOTS)
    store = store_of(run)
    wait_until(lambda: store.lanes(-1).size > 0, 30, "the workers to announce their lanes")
    clone = run.app.tasks["fairapp.clone"]
    # when five heavy clients publish 300 jobs each at once (in turns), and right after, eight
    # light clients whose keys nobody chose for their hash publish one each (with five heavy
    # keys in eight shards, several of them share a heavy key's shard),
    heavy = ["A", "A1", "A2", "A3", "A4"]
    for i in range(300):
        for key in heavy:
            clone.apply_async([f"{key}-{i}", 0.02], fairness_key=key)
    published = time.time()
    light = [f"light-{i}" for i in range(8)]
    assert {shard_of(k, SHARDS) for k in light} & {shard_of(k, SHARDS) for k in heavy}
    for key in light:
        clone.apply_async([key, 0.02], fairness_key=key)
    # then each heavy key has a lane of its own, and the light clients all start behind few
    # of the heavy keys' 1,500 jobs (without lanes: the backlog of their shards, hundreds).
    assigned = [store.lanes(-1).lane_of(k) for k in heavy]
    assert None not in assigned
    assert len(set(assigned)) == len(heavy), assigned
    between = heavy_starts_before_the_light(run, published, light)
    assert len(between) <= 2 * DEFAULT_THRESHOLD + 3 * 4 * (SLOTS + 2), len(between)
    store.close()


def test_a_backlog_left_in_the_shards_before_the_workers_start_is_shared_by_them(
    make_run, start_worker, broker
):
    # Given two keys' backlogs published before any fair worker is up (no lanes are given
    # while no worker consumes them: all of it waits in the keys' shards),
    run = make_run(conf={**lane_conf(broker), "fair_lookahead": 0})
    clone = run.app.tasks["fairapp.clone"]
    for i in range(65):
        clone.apply_async([f"A{i}", 0.2], fairness_key="A")
    for i in range(170):
        clone.apply_async([f"B{i}", 0.2], fairness_key="B")
    # when two fair workers start, one after the other,
    workers = [start_worker(run, concurrency=SLOTS) for _ in range(2)]
    # then the workers find both keys crowding their shards (rule 3) and the keys get lanes,
    store = store_of(run)
    lanes = store.lanes
    wait_until(lambda: None not in (lanes(-1).lane_of("A"), lanes(-1).lane_of("B")), 20, "lanes")
    # but what waits in the shards drains from there a window at a time by each worker: each
    # runs a fair part of the work (RabbitMQ once read past it all, as stragglers, into the
    # first worker, which ran 223 of the 235 while the other idled).
    wait_until(lambda: len(run.recorder.done_counts()) == 235, 120, "all 235 jobs")
    per_worker = {w.pid: 0 for w in workers}
    for event in run.recorder.events():
        if event["event"] == "start":
            per_worker[event["ppid"]] += 1
    assert sum(per_worker.values()) == 235
    assert min(per_worker.values()) >= 235 // 3, per_worker
    store.close()
