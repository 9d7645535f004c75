"""Job control (issue 22) with real producers and real ``celery worker -P fair`` processes."""

from __future__ import annotations

import json
import uuid

from celery.canvas import StampingVisitor
from harness import BACKEND, gate_stats, later_queue, node, producers_at_once, wait_until
from test_fair_command import fair_command
from test_fleet import fleet_conf, store_of

from celery_fair.control import cancel, jobs, reprioritize, status
from celery_fair.routing import DEFAULT_SHARDS, shard_of

# A producer of its own: it builds the test's app from the environment (fairapp.py), waits
# for the agreed moment, submits with an idempotency key and prints the task id it got.
PRODUCER = """
import sys, time
import fairapp
at = float(sys.argv[1])
while time.time() < at:
    time.sleep(0.001)
result = fairapp.app.tasks["fairapp.clone"].apply_async(
    ["once", 0.01], fairness_key="ci", idempotency_key="build-7"
)
print(result.id)
"""


def test_a_duplicate_submit_from_two_producers_at_once_runs_once(make_run, start_worker, broker):
    # Given a worker, and two producer processes that submit the same (fairness key,
    # idempotency key) at the same moment,
    run = make_run(conf=fleet_conf(broker))
    start_worker(run, concurrency=2)
    ids = [out.strip() for out in producers_at_once(run, PRODUCER, 2)]
    # then both get the same task id, and the job runs once.
    assert ids[0], ids
    assert ids[0] == ids[1], ids
    wait_until(lambda: run.recorder.done_counts().get("once") == 1, 30, "the job to run")
    # A later submit with another key runs; the duplicate never does.
    clone = run.app.tasks["fairapp.clone"]
    clone.apply_async(["other", 0.01], fairness_key="ci", idempotency_key="build-8")
    wait_until(lambda: run.recorder.done_counts().get("other") == 1, 30, "the other job")
    assert run.recorder.done_counts()["once"] == 1


def test_status_says_where_a_job_is_and_explain_says_what_holds_it(make_run, start_worker, broker):
    # Given a worker of one process running a long clone of linux, and behind it another
    # clone of linux, held by the conflict (alone: nothing is admitted ahead of a free slot),
    # (what the gate answers for each place a job can be, with every field, is
    # tests/unit/test_gate_control.py's: here the answer's round trip, named by its worker)
    run = make_run(backend=BACKEND, conf={"fair_store_url": "memory"})
    worker = start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    # (a minute, ended by the test once it has looked: each ask waits 1 s for replies, and a
    # loaded host takes seconds to start the command line)
    long = clone.apply_async(["long", 60.0], fairness_key="a", job_id="linux")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    same = clone.apply_async(["same", 0.01], fairness_key="b", job_id="linux")

    def held(result):
        found = status(run.app, result.id)
        return found if found["state"] == "held" else None

    # then the running one is running on that worker,
    running = status(run.app, long.id)
    assert running["state"] == "running"
    assert running["worker"] == node(worker)
    # the held one is held there, with its place and what holds it, in words,
    blocked = wait_until(lambda: held(same), 20, "the same-repo job held")
    assert blocked["worker"] == node(worker)
    assert blocked["fairness_key"] == "b"
    assert blocked["place"] == 1
    assert blocked["why"][0].startswith(f"conflict on git:linux held by task {long.id} for ")
    # (the command line says the same)
    shown = fair_command(run, "job", same.id)
    assert shown.returncode == 0, shown.stderr
    assert f"{same.id}: held on {node(worker)}" in shown.stdout
    assert "expected to start in about" in shown.stdout
    assert f"  - conflict on git:linux held by task {long.id} for " in shown.stdout
    # and once done, the result backend says so; an id nobody knows is unknown.
    run.recorder.release("long")
    wait_until(lambda: run.recorder.done_counts().get("same") == 1, 30, "the held job to run")
    wait_until(lambda: status(run.app, same.id)["state"] == "done", 20, "same: done")
    assert status(run.app, "no-such-task")["state"] == "unknown"


def test_a_held_job_revoked_by_stamped_headers_leaves_the_gate_at_once(make_run, start_worker):
    # Given a worker of one process busy with a long job, which has already seen a revoke by
    # stamped headers under the scheme used below (the scheme is known: a second revoke under
    # it adds a stamp, not a scheme),
    run = make_run(conf={"fair_store_url": "memory", "fair_sweep_interval": 0.2})
    worker = start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    clone.apply_async(["long", 6.0], fairness_key="a")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    run.app.control.revoke_by_stamped_headers(
        {"monitoring_id": "earlier"}, reply=True, destination=[node(worker)]
    )
    monitoring_id = uuid.uuid4().hex

    class Stamp(StampingVisitor):
        def on_signature(self, sig, **headers):
            return {"monitoring_id": monitoring_id, "stamped_headers": ["monitoring_id"]}

    sig = clone.si("stamped", 0.01).set(fairness_key="b")
    sig.stamp(visitor=Stamp())
    sig.apply_async()
    wait_until(lambda: gate_stats(run, worker).get("fair-held") == 1, 20, "the job held")
    # when it is revoked by its stamp while it waits,
    run.app.control.revoke_by_stamped_headers(
        {"monitoring_id": monitoring_id}, reply=True, destination=[node(worker)]
    )
    # then the gate drops it at its next sweep, while the long job still runs (not when it
    # would have started), and it never runs.
    wait_until(lambda: gate_stats(run, worker).get("fair-held") == 0, 20, "the job dropped")
    assert "long" not in run.recorder.done_counts()
    wait_until(lambda: run.recorder.done_counts().get("long") == 1, 20, "the long job")
    clone.apply_async(["after", 0.01], fairness_key="c")
    wait_until(lambda: run.recorder.done_counts().get("after") == 1, 20, "a later job")
    assert "stamped" not in run.recorder.done_counts()


def test_cancel_answers_for_each_place_a_job_can_be_and_refunds_what_never_ran(
    make_run, start_worker, broker
):
    # Given a worker of one process that admits one job ahead of a free slot, busy with a long
    # job; behind it one job admitted ahead (its key charged in the store) and one held,
    run = make_run(backend=BACKEND, conf=fleet_conf(broker, fair_lookahead=1))
    worker = start_worker(run, concurrency=1)
    store = store_of(run)
    clone = run.app.tasks["fairapp.clone"]
    # (a minute, ended by the test: each cancel waits 1 s for replies)
    long = clone.apply_async(["long", 60.0], fairness_key="a")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    ahead = clone.apply_async(["ahead", 0.01], fairness_key="b")
    wait_until(lambda: store.accumulated_cost("b") == 1.0, 20, "the next job's admission")
    held = clone.apply_async(["held", 0.01], fairness_key="c")
    wait_until(lambda: status(run.app, held.id)["state"] == "held", 20, "the third job held")
    # when each is cancelled,
    running = cancel(run.app, long.id)
    first = cancel(run.app, ahead.id)
    second = cancel(run.app, held.id)
    # then the waiting ones are cancelled on that worker, the admitted one's key refunded,
    assert first == {"task_id": ahead.id, "state": "cancelled", "worker": node(worker)}
    assert second == {"task_id": held.id, "state": "cancelled", "worker": node(worker)}
    wait_until(lambda: store.accumulated_cost("b") == 0.0, 20, "the refund")
    assert store.accumulated_cost("c") == 0.0  # never admitted: never charged
    assert run.app.AsyncResult(held.id).state == "REVOKED"  # recorded as Celery records it
    # the running one runs on (not terminated), then is done; cancelling again says so.
    assert running["state"] == "already_running"
    assert running["terminated"] is False
    run.recorder.release("long")
    wait_until(lambda: run.recorder.done_counts().get("long") == 1, 20, "the long job")
    wait_until(
        lambda: cancel(run.app, long.id)["state"] == "already_done", 20, "long: already_done"
    )
    assert cancel(run.app, held.id)["state"] == "cancelled"
    assert cancel(run.app, "no-such-task")["state"] == "unknown"
    shown = fair_command(run, "cancel", long.id)  # the command line says the same
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"{long.id}: already_done"
    # A job still in the broker (on a queue no worker reads yet: with the defaults, what a
    # burst beyond the worker's window is) is unknown to every worker, and the answer says
    # which workers will drop it when it arrives, and that the registry was not asked;
    queued = clone.apply_async(["queued", 0.01], fairness_key="d", queue=later_queue(run))
    assert status(run.app, queued.id) == {
        "task_id": queued.id,
        "state": "unknown",
        "tracking": False,
    }
    shown = fair_command(run, "job", queued.id)  # (the command line says it in words)
    assert shown.stdout.strip() == (
        f"{queued.id}: unknown: not held by any worker, and no result recorded; if it is "
        "still in the broker, it waits there (turn on fair_track_submits to see it there)"
    )
    assert cancel(run.app, queued.id) == {
        "task_id": queued.id,
        "state": "unknown",
        "remembered_by": [node(worker)],
        "tracking": False,
    }
    queued2 = clone.apply_async(["queued2", 0.01], fairness_key="d", queue=later_queue(run))
    shown = fair_command(run, "cancel", queued2.id)  # (a second cancel says cancelled)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == (
        f"{queued2.id}: unknown: not held by any worker; if it is still in the broker, the "
        "worker that answered will drop it when it arrives (turn on fair_track_submits to see "
        "it there)"
    )
    # then both are dropped when they arrive; the job behind them runs.
    clone.apply_async(["behind", 0.01], fairness_key="d", queue=later_queue(run))
    run.app.control.add_consumer(later_queue(run), destination=[node(worker)], reply=True)
    wait_until(lambda: run.recorder.done_counts().get("behind") == 1, 20, "the job behind")
    # A running job cancelled with terminate=True is stopped.
    slow = clone.apply_async(["slow", 60.0], fairness_key="e")
    wait_until(lambda: status(run.app, slow.id)["state"] == "running", 20, "the slow job")
    stopped = cancel(run.app, slow.id, terminate=True, signal="KILL")
    assert stopped["state"] == "already_running"
    assert stopped["terminated"] is True
    wait_until(lambda: run.app.AsyncResult(slow.id).state == "REVOKED", 20, "slow: revoked")
    clone.apply_async(["after", 0.01], fairness_key="f")
    wait_until(lambda: run.recorder.done_counts().get("after") == 1, 20, "a later job")
    done = run.recorder.done_counts()
    assert not {"ahead", "held", "queued", "queued2", "slow"} & set(done), done
    store.close()


def test_explain_names_a_conflicts_holder_on_another_worker(make_run, start_worker, broker):
    # Given worker A running a long clone of linux, then no longer reading the queue, and
    # worker B sharing A's store,
    run = make_run(conf=fleet_conf(broker, fair_shards=1))
    a = start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    long = clone.apply_async(["long", 60.0], fairness_key="a", job_id="linux")  # ended below
    wait_until(lambda: run.recorder.events(), 20, "the long job to start on A")
    run.app.control.cancel_consumer(run.queue, destination=[node(a)], reply=True)
    start_worker(run, concurrency=1)
    # when B gets another clone of linux,
    same = clone.apply_async(["same", 0.01], fairness_key="b", job_id="linux")

    # then, once B has asked the store for it and been refused (before that, B's core sees
    # the job first in line), its status names the job that holds the conflict, its worker
    # and for how long.
    def refused():
        s = status(run.app, same.id)
        return s if any(w.startswith("conflict on") for w in s.get("why", ())) else None

    found = wait_until(
        refused, 20, "same: held, refused on its conflict", show=lambda: status(run.app, same.id)
    )
    assert found["why"][0].startswith(
        f"conflict on git:linux held by task {long.id} on {node(a)} for "
    )
    assert found["holder"]["uid"] == long.id
    run.recorder.release("long")


def starts(run):
    """Tags in the order they started."""
    return [e["tag"] for e in run.recorder.events() if e["event"] == "start"]


def keys_apart(n, *, besides="a"):
    """``n`` fairness keys whose shards differ from each other's and from ``besides``'s: on
    RabbitMQ each shard's window at a worker of one process holds 2, so their jobs all reach
    the worker (one key's backlog beyond its window waits in the broker, in order)."""
    taken = {shard_of(besides, DEFAULT_SHARDS)}
    out = []
    for i in range(1000):
        shard = shard_of(f"k{i}", DEFAULT_SHARDS)
        if shard not in taken:
            taken.add(shard)
            out.append(f"k{i}")
            if len(out) == n:
                return out
    raise AssertionError("not enough shards")


def test_reprioritise_moves_a_held_job_ahead_and_remembers_one_it_does_not_have(
    make_run, start_worker, broker
):
    # Given a worker of one process (nothing admitted ahead of it) running a long job of key
    # a, and held behind it four jobs of keys that have used nothing and, last, a job of a,
    # (the gate's answers and moves are tests/unit/test_gate_control.py's: here their round
    # trip, named by the worker, and the client's words)
    run = make_run(backend=BACKEND, conf=fleet_conf(broker, fair_lookahead=0))
    worker = start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    # (a minute, ended by the test: each ask waits 1 s for replies)
    long = clone.apply_async(["long", 60.0], fairness_key="a")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    for i, key in enumerate(keys_apart(4)):
        clone.apply_async([f"bulk{i}", 0.2], fairness_key=key)
    late = clone.apply_async(["late", 0.2], fairness_key="a")
    before = wait_until(
        lambda: (s := status(run.app, late.id)).get("place") == 5 and s, 20, "late: 5th, held"
    )
    assert before["priority"] == 8
    # when it is given priority 9,
    moved = reprioritize(run.app, late.id, 9)
    # then it is first among the held jobs, at priority 9, and starts first when the slot frees;
    assert moved == {"task_id": late.id, "priority": 9, "state": "ok", "worker": node(worker)}
    after = status(run.app, late.id)
    assert (after["state"], after["place"], after["priority"]) == ("held", 1, 9)
    # the running job answers already_running, an unknown one unknown.
    assert reprioritize(run.app, long.id, 9)["state"] == "already_running"
    # (one it does not have it remembers, to give it when it arrives: tests/unit/test_gate.py and
    # test_gate_control.py drive that arrival)
    assert reprioritize(run.app, "no-such-task", 9) == {
        "task_id": "no-such-task",
        "priority": 9,
        "state": "unknown",
        "remembered_by": [node(worker)],
        "tracking": False,
    }
    run.recorder.release("long")
    wait_until(lambda: run.recorder.done_counts().get("late") == 1, 30, "the late job")
    assert starts(run)[:2] == ["long", "late"], starts(run)
    shown = fair_command(run, "reprioritize", long.id, "5")  # the command line says the same
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"{long.id}: already_done"
    shown = fair_command(run, "reprioritize", "no-such-task", "9")  # an unknown one in words
    assert shown.stdout.strip() == (
        "no-such-task: unknown: not held by any worker; if it is still in the broker, the "
        "worker that answered will run it at priority 9 when it arrives (turn on "
        "fair_track_submits to see it there)"
    )
    refused = fair_command(run, "reprioritize", late.id, "0")  # and refuses a bad priority
    assert refused.returncode == 2
    assert "'0' is not a positive int or 'type'" in refused.stderr


def test_a_job_published_at_a_priority_of_its_own_goes_before_the_keys_that_used_less(
    make_run, start_worker, broker
):
    # Given a worker of one process running a long job of key a, with jobs of keys that have
    # used nothing held behind it, and then a job of key a published with fair_priority=9
    # (its type's is 8; tier 9 is declared by fair_tier_caps),
    run = make_run(conf=fleet_conf(broker, fair_lookahead=0, fair_tier_caps={9: 9}))
    start_worker(run, concurrency=1)
    clone = run.app.tasks["fairapp.clone"]
    clone.apply_async(["long", 2.0], fairness_key="a")
    wait_until(lambda: run.recorder.events(), 20, "the long job to start")
    for i, key in enumerate(keys_apart(4)):
        clone.apply_async([f"bulk{i}", 0.05], fairness_key=key)
    clone.apply_async(["urgent", 0.05], fairness_key="a", fair_priority=9)
    # then it starts right after the long job, before the jobs published before it.
    wait_until(lambda: len(run.recorder.done_counts()) == 6, 30, "every job")
    assert starts(run)[:2] == ["long", "urgent"], starts(run)


def test_jobs_lists_a_tenants_jobs_across_the_fleet_by_state_and_type(
    make_run, start_worker, broker
):
    # Given two workers of one process each, one reading the run's queue, the other a queue of
    # its own, both busy with a long job of tenant acme (a clone on one, a snapshot on the
    # other), and behind the clone acme's and bob's clones of the same repository, held,
    run = make_run(conf=fleet_conf(broker, fair_shards=1))
    other = later_queue(run)
    workers = [start_worker(run, concurrency=1), start_worker(run, concurrency=1, queues=(other,))]
    clone = run.app.tasks["fairapp.clone"]
    snapshot = run.app.tasks["fairapp.snapshot"]
    # (a minute, ended by the test once it has looked)
    clone.apply_async(["long-clone", 60.0], fairness_key="acme", job_id="linux")
    snapshot.apply_async(["long-snap", 60.0], fairness_key="acme", queue=other)
    wait_until(lambda: len(run.recorder.events()) == 2, 30, "both long jobs to start")
    waiting = {
        clone.apply_async([f"{key}-{i}", 0.01], fairness_key=key, job_id="linux").id: key
        for key in ("acme", "bob")
        for i in range(3)
    }
    held = lambda: jobs(run.app, state="held")["jobs"]  # noqa: E731
    wait_until(lambda: len(held()) == 6, 20, "every waiting job held by a worker")
    # when job control lists acme's jobs,
    found = jobs(run.app, key="acme")
    # then it has them from both workers, running first, each named by its worker,
    assert found["workers"] == 2
    assert found["matched"] == 5
    assert [j["state"] for j in found["jobs"]] == ["running"] * 2 + ["held"] * 3
    assert {j["worker"] for j in found["jobs"][:2]} == {node(w) for w in workers}
    acme = {task_id for task_id, key in waiting.items() if key == "acme"}
    assert {j["task_id"] for j in found["jobs"][2:]} == acme
    # by type, and no more than asked (with how many matched);
    snaps = jobs(run.app, key="acme", type="snapshot")["jobs"]
    assert [(j["type"], j["state"]) for j in snaps] == [("snapshot", "running")]
    page = jobs(run.app, limit=4)
    assert (len(page["jobs"]), page["matched"]) == (4, 8)
    # and the command line says the same.
    shown = fair_command(run, "jobs", "--key", "bob", "--json")
    assert shown.returncode == 0, shown.stderr
    listed = json.loads(shown.stdout)
    assert {j["task_id"] for j in listed["jobs"]} == set(waiting) - acme
    words = fair_command(run, "jobs", "--state", "running")
    assert words.returncode == 0, words.stderr
    assert "2 jobs on 2 fair workers" in words.stdout
    run.recorder.release("long-clone")
    run.recorder.release("long-snap")
    wait_until(lambda: len(run.recorder.done_counts()) == 8, 30, "every job")
    assert jobs(run.app)["matched"] == 0
