"""Celery reuses task ids; the gate counts each run of a request on its own all the same.

``Task.replace`` sends its replacement with the replaced task's id while that task is still
ending; a message the broker (or a producer) duplicates carries its original's id; a revoked id
can be published again. Each case used to leave a slot counted for good, and on a one-process
worker without a shared store that left no room for any fair job. After each case here the
gate counts nothing inside it, and a fair job published next runs.

A single worker with one process per world: ``memory`` keeps the fair state in the worker,
where a lost slot was lost for good; ``store`` shares it through Redis (the default on the
Redis broker), where the store's own counts and tombstones are at stake too.
"""

from __future__ import annotations

import contextlib
import socket
import uuid

import pytest
from celery import chord, group
from celery.canvas import StampingVisitor
from celery.signals import before_task_publish
from harness import BACKEND, Run, Worker, gate_stats, wait_until, wait_until_gate_idle

from celery_fair import fair_headers


@pytest.fixture(
    scope="module",
    params=[("redis", "memory"), ("amqp", "memory"), ("redis", "store")],
    ids=["redis-memory", "amqp-memory", "redis-store"],
)
def world(request, tmp_path_factory):
    broker, state = request.param
    conf = {"fair_store_url": "memory"} if state == "memory" else {}
    run = Run(broker, backend=BACKEND, conf=conf)
    worker = Worker(run, concurrency=1, log_dir=tmp_path_factory.mktemp("logs"))
    worker.start()
    yield run, worker
    worker.stop()
    run.cleanup()


def tag_of(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def runs(run: Run, tag: str) -> int:
    return run.recorder.done_counts().get(tag, 0)


def started(run: Run, tag: str) -> list[dict]:
    return [e for e in run.recorder.events() if e["event"] == "start" and e["tag"] == tag]


def then_a_fair_job_runs(run: Run, worker: Worker) -> None:
    """The gate is idle, and a fair job published now runs (a lost slot would hold it)."""
    wait_until_gate_idle(run, worker)
    tag = tag_of("after")
    run.send("fairapp.clone", tag, 0.01, headers=fair_headers("clone", "k", tag))
    wait_until(lambda: runs(run, tag), 20, "a fair job after", show=lambda: gate_stats(run, worker))
    wait_until_gate_idle(run, worker)


@contextlib.contextmanager
def duplicated(run: Run, *names: str):
    """Every message of tasks ``names`` that this process publishes goes to the broker twice,
    as a broker that duplicates messages would deliver it (Celery's own test of that case
    duplicates the same way)."""

    def twice(sender=None, body=None, exchange=None, routing_key=None, headers=None, **kw):
        if sender not in names:
            return
        with run.app.connection_for_write() as connection:
            connection.Producer().publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                headers=headers,
                serializer="json",
                **{k: v for k, v in (kw.get("properties") or {}).items() if k != "delivery_info"},
            )

    before_task_publish.connect(twice, weak=False)
    try:
        yield
    finally:
        before_task_publish.disconnect(twice)


def test_task_replace_nested_frees_every_slot(world):
    run, worker = world
    once, nested = tag_of("replaced"), tag_of("nested")
    run.send("fairapp.replaced", once, 1, 0.3)
    run.send("fairapp.replaced", nested, 3, 0.3)
    wait_until(lambda: runs(run, once) and runs(run, nested), 30, "both replacement chains")
    assert [e["nesting"] for e in started(run, f"{nested}@0")] == [3]
    then_a_fair_job_runs(run, worker)


def test_a_fair_task_replaced_by_fair_tasks_runs_every_replacement(world):
    # Given a fair task that replaces itself twice: each replacement has the replaced task's id
    # and arrives while it is still ending, or just after it finished for good.
    run, worker = world
    tag = tag_of("fair-replaced")
    run.app.tasks["fairapp.fair_replaced"].apply_async([tag, 2, 0.3], fairness_key="client-r")
    # Then every replacement runs once, none is taken for a copy of the one it replaces, and
    # each inherits the client's fairness key.
    wait_until(lambda: runs(run, tag), 30, "the last replacement")
    levels = [started(run, f"{tag}@{depth}") for depth in (2, 1, 0)]
    assert [[e["nesting"] for e in level] for level in levels] == [[0], [1], [2]]
    assert {e["key"] for level in levels for e in level} == {"client-r"}
    then_a_fair_job_runs(run, worker)


def test_a_plain_task_id_published_twice_runs_twice_and_frees_both_slots(world):
    run, worker = world
    tag, task_id = tag_of("twice"), str(uuid.uuid4())
    for _ in range(2):  # the second arrives while the first runs
        run.send("fairapp.plain", tag, 0.5, task_id=task_id)
    wait_until(lambda: runs(run, tag) == 2, 30, "both runs, as plain Celery runs them")
    then_a_fair_job_runs(run, worker)


def test_a_fair_task_id_published_twice_is_one_job(world):
    run, worker = world
    tag, task_id = tag_of("fair-twice"), str(uuid.uuid4())
    before = gate_stats(run, worker)["fair-duplicates"]
    headers = fair_headers("clone", "k", tag)
    run.send("fairapp.clone", tag, 1.0, task_id=task_id, headers=headers)
    wait_until(lambda: started(run, tag), 20, "the first copy to start")
    run.send("fairapp.clone", tag, 1.0, task_id=task_id, headers=headers)
    wait_until(
        lambda: gate_stats(run, worker)["fair-duplicates"] > before, 20, "the copy to be dropped"
    )
    then_a_fair_job_runs(run, worker)
    assert runs(run, tag) == 1


# Late copies are recognised by the shared store's tombstones: the world with a shared store.
@pytest.mark.parametrize("world", [("redis", "store")], indirect=True, ids=["redis-store"])
def test_a_late_copy_of_a_job_this_worker_finished_is_dropped_as_this_workers(world):
    # Given a fair job this worker ran to the end (its message acknowledged),
    run, worker = world
    tag, task_id = tag_of("late-copy"), str(uuid.uuid4())
    headers = fair_headers("clone", "k", tag)
    run.send("fairapp.clone", tag, 0.01, task_id=task_id, headers=headers)
    wait_until(lambda: runs(run, tag), 20, "the job to run")
    wait_until_gate_idle(run, worker)
    before = gate_stats(run, worker)["fair-duplicates"]
    # when a copy of its message arrives within fair_dedupe_seconds (a Redis visibility
    # timeout's redelivery, a producer that publishes twice),
    run.send("fairapp.clone", tag, 0.01, task_id=task_id, headers=headers)
    wait_until(
        lambda: gate_stats(run, worker)["fair-duplicates"] > before, 20, "the copy to be dropped"
    )
    # then the copy is dropped, and the log says the job ran here, not on another worker.
    assert f"[{task_id}] already ran to the end on this worker; dropping this copy." in (
        worker.log()
    )
    assert runs(run, tag) == 1
    then_a_fair_job_runs(run, worker)


def test_a_chord_whose_header_messages_are_duplicated(world):
    run, worker = world
    plain, clone = run.app.tasks["fairapp.plain"], run.app.tasks["fairapp.clone"]
    tags, body = [tag_of("header") for _ in range(3)], tag_of("body")
    with duplicated(run, "fairapp.plain"):
        result = chord([plain.s(t, 0.3) for t in tags], plain.si(body, 0.01)).apply_async()
    assert result.get(timeout=30) == body
    # Plain tasks run as plain Celery runs them: every copy.
    wait_until(lambda: all(runs(run, t) == 2 for t in tags), 30, "every copy of the header")
    then_a_fair_job_runs(run, worker)
    # Fair header tasks: a copy of a job is that job (each copy arrives while its original is
    # held or runs), so every header job runs once and the chord's body once.
    tags, body = [tag_of("fair-header") for _ in range(3)], tag_of("fair-body")
    header = [clone.s(t, 0.3).set(fairness_key="k", job_id=t) for t in tags]
    with duplicated(run, "fairapp.clone"):
        result = chord(header, plain.si(body, 0.01)).apply_async()
    assert result.get(timeout=30) == body
    then_a_fair_job_runs(run, worker)
    assert [runs(run, t) for t in tags] == [1, 1, 1]
    assert runs(run, body) == 1


def test_revoked_ids_published_again_free_their_slots(world):
    run, worker = world
    node = f"{worker.name}@{socket.gethostname()}"
    plain_id, fair_id = str(uuid.uuid4()), str(uuid.uuid4())
    replies = run.app.control.revoke([plain_id, fair_id], reply=True, destination=[node])
    assert replies, "the worker did not confirm the revoke"
    tag = tag_of("revoked")
    for _ in range(3):
        run.send("fairapp.plain", tag, 0.01, task_id=plain_id)
        run.send("fairapp.clone", tag, 0.01, task_id=fair_id, headers=fair_headers("clone", "k"))
    # Revoked by stamped headers, as Celery's own test does: one frozen task id sent many times.
    monitoring_id = uuid.uuid4().hex

    class Stamp(StampingVisitor):
        def on_signature(self, sig, **headers):
            return {"monitoring_id": monitoring_id, "stamped_headers": ["monitoring_id"]}

    run.app.control.revoke_by_stamped_headers(
        {"monitoring_id": monitoring_id}, reply=True, destination=[node]
    )
    stamped = [run.app.tasks["fairapp.plain"].si(tag, 0.01), run.app.tasks["fairapp.add"].si(1, 1)]
    for sig in stamped:
        sig.stamp(visitor=Stamp())
        sig.freeze()
    for _ in range(3):
        for sig in stamped:
            sig.apply_async()
        group(stamped).apply_async()
    then_a_fair_job_runs(run, worker)
    assert runs(run, tag) == 0
    assert runs(run, "add:1+1") == 0
