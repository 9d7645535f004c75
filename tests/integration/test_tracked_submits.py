"""Tracked submissions and backpressure (issue 22, seed 002): producers record each fair
submit in the shared store until it ends (``fair_track_submits``), so job control sees jobs
still in the broker and a limit refuses a submit before anything is published. Real
``celery worker -P fair`` processes on both brokers; the registry is the real Redis store."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.signals import before_task_publish
from harness import (
    BACKEND,
    gate_stats,
    later_queue,
    node,
    producers_at_once,
    queue_length,
    wait_until,
)
from test_fair_command import fair_command
from test_fleet import fleet_conf, store_of

from celery_fair import ConfigurationError, QueueFull, send
from celery_fair.control import cancel, jobs, reprioritize, status


def test_a_job_still_in_the_broker_is_queued_with_its_place_and_cancel_drops_it(
    make_run, start_worker, broker
):
    # Given producers that track their submissions, a worker busy with a long job, and three
    # jobs of key "k" on a queue no worker reads yet (in the broker),
    run = make_run(backend=BACKEND, conf=fleet_conf(broker, fair_track_submits=True))
    worker = start_worker(run, concurrency=1)
    store = store_of(run)
    clone = run.app.tasks["fairapp.clone"]
    long = clone.apply_async(["long", 2.0], fairness_key="a")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    later = [
        clone.apply_async([f"later{i}", 0.01], fairness_key="k", queue=later_queue(run))
        for i in range(3)
    ]
    # then each is queued, with its place in its key and among everything not ended,
    found = status(run.app, later[1].id)
    assert found["state"] == "queued"
    assert (found["fairness_key"], found["place_in_key"], found["in_key"]) == ("k", 2, 3)
    assert (found["place"], found["total"]) == (3, 4)  # the long job was submitted first
    # and a cancel says cancelled (not unknown): every worker drops it when it arrives.
    assert cancel(run.app, later[1].id) == {
        "task_id": later[1].id,
        "state": "cancelled",
        "queued": True,
    }
    assert status(run.app, later[2].id)["place_in_key"] == 2  # it no longer counts
    # A reprioritise says ok (not unknown): every worker remembers it for when it arrives.
    assert reprioritize(run.app, later[2].id, 9) == {
        "task_id": later[2].id,
        "priority": 9,
        "state": "ok",
        "queued": True,
    }
    run.app.control.add_consumer(later_queue(run), destination=[node(worker)], reply=True)
    wait_until(
        lambda: {"later0", "later2", "long"} <= set(run.recorder.done_counts()), 30, "the rest"
    )
    # Once every job ended (ran, or was revoked), none is tracked any more.
    for job in [long, *later]:
        wait_until(lambda job=job: store.queued(job.id) is None, 20, f"{job.id} forgotten")
    assert "later1" not in run.recorder.done_counts()
    store.close()


def test_a_queued_job_is_expected_to_start_after_its_keys_jobs_ahead_at_their_pace(
    make_run, start_worker, broker
):
    # Given tracked submissions and a worker of one process running key k's jobs one after
    # another, and one more job of k on a queue no worker reads (in the broker),
    run = make_run(conf=fleet_conf(broker, fair_track_submits=True, fair_lookahead=0))
    start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    for i in range(30):
        clone.apply_async([f"k{i}", 0.1], fairness_key="k")
    later = clone.apply_async(["later", 0.01], fairness_key="k", queue=later_queue(run))
    # once k's jobs have ended for a second, its status says when it is expected to start:
    # its key's jobs ahead of it at the pace they end,
    found = wait_until(
        lambda: (s := status(run.app, later.id)).get("expected_wait") is not None and s,
        30,
        "k's rate of ends",
    )
    assert found["state"] == "queued"
    assert 0 < found["key_rate"] <= 12  # one process, jobs of 0.1 s: at most 10 a second
    assert found["expected_wait"] == pytest.approx((found["place_in_key"] - 1) / found["key_rate"])
    shown = fair_command(run, "job", later.id)  # and the command line says so
    assert shown.returncode == 0, shown.stderr
    assert "expected to start in about" in shown.stdout, shown.stdout
    wait_until(lambda: run.recorder.done_counts().get("k29") == 1, 30, "k's jobs")


def test_past_a_keys_limit_a_submit_is_refused_and_nothing_is_published(
    make_run, start_worker, broker
):
    # Given a limit of 3 jobs submitted and not ended per fairness key, and no worker yet,
    run = make_run(conf=fleet_conf(broker, fair_max_queued_per_key=3, fair_shards=1))
    clone = run.app.tasks["fairapp.clone"]
    for i in range(3):
        clone.apply_async([f"a{i}", 0.01], fairness_key="a")
    # when key "a" submits a fourth, it is refused with a hint, before anything is published,
    with pytest.raises(QueueFull) as refused:
        clone.apply_async(["a3", 0.01], fairness_key="a")
    assert (refused.value.scope, refused.value.count, refused.value.limit) == ("key", 3, 3)
    assert refused.value.retry_after == 1.0  # clone's default cost: nothing learned yet
    assert queue_length(run, run.queue) == 3
    # while another key still submits,
    clone.apply_async(["b0", 0.01], fairness_key="b")
    assert queue_length(run, run.queue) == 4
    # and once key "a"'s jobs have run, its places are free again.
    start_worker(run, concurrency=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 4, 30, "the four jobs")
    wait_until(lambda: _submits(clone, "a", "again"), 20, "a submit of key a to be accepted again")
    wait_until(lambda: run.recorder.done_counts().get("again") == 1, 20, "the new job")


def _submits(task, key, tag):
    try:
        task.apply_async([tag, 0.01], fairness_key=key)
    except QueueFull:
        return False
    return True


def test_on_queue_full_return_gives_the_refusal_back_instead_of_raising(make_run, broker):
    run = make_run(conf=fleet_conf(broker, fair_max_queued=2, fair_on_queue_full="return"))
    clone = run.app.tasks["fairapp.clone"]
    first = [clone.apply_async([f"j{i}", 0.01], fairness_key=f"k{i}") for i in range(2)]
    assert all(r.id for r in first)
    full = clone.apply_async(["j2", 0.01], fairness_key="k2")
    assert isinstance(full, QueueFull)
    assert (full.scope, full.count, full.limit) == ("total", 2, 2)


# A producer of its own: it waits for the agreed moment, then submits 10 jobs of key "burst"
# and prints how many were accepted.
PRODUCER = """
import sys, time
import fairapp
from celery_fair import QueueFull
at = float(sys.argv[1])
while time.time() < at:
    time.sleep(0.001)
accepted = 0
for i in range(10):
    try:
        fairapp.app.tasks["fairapp.clone"].apply_async(["x", 0.01], fairness_key="burst")
        accepted += 1
    except QueueFull:
        pass
print(accepted)
"""


def test_a_limit_holds_for_producers_submitting_at_once(make_run, broker):
    # Given a limit of 10 per key, and three producer processes that each submit 10 jobs of
    # one key at the same moment,
    run = make_run(conf=fleet_conf(broker, fair_max_queued_per_key=10, fair_shards=1))
    outputs = producers_at_once(run, PRODUCER, 3)
    # then 10 were accepted in all, and exactly 10 published.
    assert sum(int(out) for out in outputs) == 10, outputs
    assert queue_length(run, run.queue) == 10


def test_a_copy_dropped_because_its_job_already_ran_leaves_no_tracked_entry(
    make_run, start_worker, broker
):
    # Given a limit of one job per key (so tracking), and a job of key "k" that ran to the end,
    run = make_run(conf=fleet_conf(broker, fair_max_queued_per_key=1))
    worker = start_worker(run, concurrency=1)
    store = store_of(run)
    clone = run.app.tasks["fairapp.clone"]
    first = clone.apply_async(["first", 0.01], fairness_key="k")
    wait_until(lambda: store.queued(first.id) is None, 20, "the first run to end")
    # when its task id is published again within fair_dedupe_seconds (tracked again),
    before = gate_stats(run, worker)["fair-duplicates"]
    entries = []  # read as the copy is published: the worker may drop it a moment after

    def read_entry(sender: str, headers: dict, **_: object) -> None:
        entries.append(store.queued(headers["id"]))

    before_task_publish.connect(read_entry, weak=False, dispatch_uid="test-copy-entry")
    try:
        clone.apply_async(["first", 0.01], fairness_key="k", task_id=first.id)
    finally:
        before_task_publish.disconnect(dispatch_uid="test-copy-entry")
    assert len(entries) == 1
    assert entries[0] is not None
    # the worker drops it as a copy and forgets its entry: it is no longer "queued", and it
    # does not hold key k's one place,
    wait_until(
        lambda: gate_stats(run, worker)["fair-duplicates"] > before, 20, "the copy to be dropped"
    )
    wait_until(lambda: store.queued(first.id) is None, 20, "the copy's entry to be forgotten")
    assert status(run.app, first.id)["state"] != "queued"
    again = wait_until(lambda: _submits(clone, "k", "again"), 20, "k's place to be free")
    assert again
    wait_until(lambda: run.recorder.done_counts().get("again") == 1, 20, "the next job")
    assert run.recorder.done_counts()["first"] == 1  # the copy never ran
    store.close()


def test_a_copy_dropped_while_its_job_runs_leaves_the_running_jobs_entry(
    make_run, start_worker, broker
):
    # Given tracked submissions and a job of key "k" running on the only worker,
    run = make_run(conf=fleet_conf(broker, fair_track_submits=True))
    worker = start_worker(run, concurrency=1)
    store = store_of(run)
    clone = run.app.tasks["fairapp.clone"]
    first = clone.apply_async(["long", 3.0], fairness_key="k")
    wait_until(lambda: run.recorder.events(), 20, "the job to start")
    # when its task id is published again and the worker drops that copy at once,
    before = gate_stats(run, worker)["fair-duplicates"]
    clone.apply_async(["long", 3.0], fairness_key="k", task_id=first.id)
    wait_until(
        lambda: gate_stats(run, worker)["fair-duplicates"] > before, 20, "the copy to be dropped"
    )
    # the entry stays while the job it stands for runs (its end forgets it),
    assert store.queued(first.id) is not None
    assert "long" not in run.recorder.done_counts()
    wait_until(lambda: store.queued(first.id) is None, 20, "the job's end to forget it")
    assert run.recorder.done_counts()["long"] == 1
    store.close()


def test_a_producer_by_task_name_gets_idempotency_and_the_queue_limits_through_send(
    make_run, start_worker, broker
):
    # Given a producer app that has none of the tasks' code (it publishes by name), a limit
    # of 3 jobs submitted and not ended per fairness key, and no worker yet,
    run = make_run(conf=fleet_conf(broker, fair_max_queued_per_key=3, fair_shards=1))
    producer = Celery("producer", broker=run.url, set_as_current=False)
    producer.conf.update(task_default_queue=run.queue, **run.conf)
    try:
        # when it sends one job twice under one idempotency key,
        first = send(
            producer, "fairapp.clone", ["a0", 0.01], job_type="clone", fairness_key="a",
            job_id="repo-0", idempotency_key="request-1",
        )  # fmt: skip
        again = send(
            producer, "fairapp.clone", ["a0", 0.01], job_type="clone", fairness_key="a",
            job_id="repo-0", idempotency_key="request-1",
        )  # fmt: skip
        # then the second publishes nothing and answers with the first's result,
        assert again.id == first.id
        assert queue_length(run, run.queue) == 1
        # and the key's limit holds for it as for a fair task: the fourth is refused before
        # anything is published;
        for i in (1, 2):
            send(producer, "fairapp.clone", [f"a{i}", 0.01], job_type="clone", fairness_key="a")
        with pytest.raises(QueueFull) as refused:
            send(producer, "fairapp.clone", ["a3", 0.01], job_type="clone", fairness_key="a")
        assert (refused.value.scope, refused.value.count, refused.value.limit) == ("key", 3, 3)
        assert refused.value.retry_after == 1.0  # clone's default cost (fair_types knows none)
        assert queue_length(run, run.queue) == 3
        # the worker runs what was published, each once, as jobs of the type named.
        start_worker(run, concurrency=2)
        wait_until(lambda: len(run.recorder.done_counts()) == 3, 30, "the three jobs")
        assert run.recorder.done_counts() == {"a0": 1, "a1": 1, "a2": 1}
        assert {e["type"] for e in run.recorder.events()} == {"clone"}
    finally:
        producer.close()


def test_jobs_lists_a_keys_jobs_still_in_the_broker_after_those_the_workers_have(
    make_run, start_worker, broker
):
    # Given producers that track their submissions, a worker of one process running a long
    # job of key "k" and holding two more of k's, and three of k's on a queue no worker reads
    # yet (in the broker),
    run = make_run(conf=fleet_conf(broker, fair_track_submits=True))
    worker = start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    clone.apply_async(["long", 60.0], fairness_key="k")  # ended by the test once it looked
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    held = [clone.apply_async([f"held{i}", 0.01], fairness_key="k").id for i in range(2)]
    wait_until(lambda: jobs(run.app, key="k")["matched"] == 3, 20, "both at the worker")
    later = [
        clone.apply_async([f"later{i}", 0.01], fairness_key="k", queue=later_queue(run)).id
        for i in range(3)
    ]
    clone.apply_async(["other", 0.01], fairness_key="o", queue=later_queue(run))
    # then the queued ones are the registry's that no worker has, oldest first,
    queued = jobs(run.app, state="queued", key="k")
    assert [j["task_id"] for j in queued["jobs"]] == later
    assert queued["matched"] == 3
    assert {(j["state"], j["fairness_key"]) for j in queued["jobs"]} == {("queued", "k")}
    # with every state, after the workers' jobs, and within the limit asked;
    every = jobs(run.app, key="k")
    states = [j["state"] for j in every["jobs"]]
    assert states[0] == "running", states
    assert states[3:] == ["queued"] * 3, states
    assert set(states[1:3]) <= {"reserved", "held"}  # (admitted ahead of a free process, or not)
    assert {j["task_id"] for j in every["jobs"][1:3]} == set(held)
    assert every["matched"] == 6
    assert [j["task_id"] for j in jobs(run.app, state="queued", limit=2)["jobs"]] == later[:2]
    assert jobs(run.app, state="queued")["matched"] == 4  # o's too
    # by type, the registry cannot say (it keeps the key alone);
    with pytest.raises(ConfigurationError, match="cannot be listed by type"):
        jobs(run.app, state="queued", type="clone")
    # and the command line says the same.
    shown = fair_command(run, "jobs", "--state", "queued", "--key", "k")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("queued, ") == 3
    assert "3 jobs on 1 fair workers" in shown.stdout
    run.recorder.release("long")
    run.app.control.add_consumer(later_queue(run), destination=[node(worker)], reply=True)
    wait_until(lambda: len(run.recorder.done_counts()) == 7, 30, "every job")
    wait_until(lambda: jobs(run.app)["matched"] == 0, 20, "every job forgotten")
