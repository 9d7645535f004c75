"""The runs handed to the pool (worker/runs.py), with Celery's own Request class: a run is
counted by its request, so task ids that Celery reuses never leak a slot."""

from __future__ import annotations

import pytest
from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage
from celery.exceptions import TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request

from celery_fair.worker.copies import FinishedHere
from celery_fair.worker.runs import Runs, wrap_callbacks


class Pool:
    """Takes each pool call as Celery makes it; ``end(i, ...)`` plays the pool's callback."""

    def __init__(self, runs: Runs, finished: list) -> None:
        self.runs, self.finished, self.calls = runs, finished, []

    def apply_async(self, target, args=None, kwargs=None, **options):
        run = self.runs.taken(options)
        if run is not None:
            options = wrap_callbacks(
                options, run, lambda r, timed: self.finished.append((r, timed))
            )
        self.calls.append(options)

    def record(self, run, timed: bool) -> None:
        self.finished.append((run, timed))

    def end(self, i: int) -> None:
        self.calls[i]["callback"]((False, 3, 0.01))  # (failed, result, runtime)

    def fail(self, i: int, exc: BaseException) -> None:
        try:  # as billiard reports a hard time limit or a lost process
            raise exc
        except BaseException:
            self.calls[i]["error_callback"](ExceptionInfo())


@pytest.fixture
def world():
    app = Celery(set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add(x, y):
        return x + y

    runs, finished = Runs(), []
    yield app, runs, Pool(runs, finished), finished
    app.close()


def request(app, task_id, **headers):
    return Request(TaskMessage("t.add", id=task_id, **headers), app=app, task=app.tasks["t.add"])


def test_two_runs_of_one_task_id_hold_a_slot_each_and_each_gives_its_own_back(world):
    app, runs, pool, finished = world
    first, second = request(app, "same"), request(app, "same")  # Task.replace, a duplicate
    for req in (first, second):
        runs.add(req, None)
    assert (len(runs), runs.plain, runs.in_line) == (2, 2, 2)
    for req in (first, second):
        req.execute_using_pool(pool)
    assert runs.in_line == 0
    pool.end(0)  # the first ends: only its own slot comes back
    ((run, timed),) = finished
    assert run.req is first
    assert timed
    assert runs.release(run)
    assert (len(runs), runs.plain) == (1, 1)
    pool.end(1)
    assert runs.release(finished[1][0])
    assert (len(runs), runs.plain, runs.in_line, runs.plain_started) == (0, 0, 0, 2)


def test_a_run_is_released_once(world):
    app, runs, _, _ = world
    run = runs.add(request(app, "x"), "x")
    assert runs.fair == {"x"}
    assert runs.release(run)
    assert not runs.release(run)
    assert (len(runs), runs.fair, runs.in_line) == (0, set(), 0)


def test_only_a_time_limit_among_failures_measures_the_job(world):
    app, runs, pool, finished = world
    for task_id in ("limit", "lost"):
        req = request(app, task_id)
        runs.add(req, task_id)
        req.execute_using_pool(pool)
    pool.fail(0, TimeLimitExceeded(1))
    pool.fail(1, WorkerLostError("lost"))
    assert [(r.req.id, timed) for r, timed in finished] == [("limit", True), ("lost", False)]


def test_a_run_celery_revoked_before_the_pool_took_it_is_found(world):
    app, runs, _, _ = world
    kept, gone = request(app, "kept"), request(app, "gone")
    runs.add(kept, None)
    run = runs.add(gone, None)
    worker_state.revoked.add("gone")
    try:
        assert gone.revoked()
    finally:
        worker_state.revoked.discard("gone")
    assert runs.revoked_in_line() == [run]


def test_a_pool_call_that_is_not_one_of_ours_is_left_alone(world):
    app, runs, pool, _ = world
    request(app, "stranger").execute_using_pool(pool)
    assert "on_done" not in pool.calls[0]["callback"].__qualname__
    assert len(runs) == 0


def test_finished_here_remembers_a_worker_s_final_ends_for_the_dedupe_window_and_no_more():
    now = [100.0]
    seen = FinishedHere(horizon=60.0, limit=3, clock=lambda: now[0])
    seen.add("a")
    now[0] = 130.0
    seen.add("b")
    assert [u in seen for u in "abc"] == [True, True, False]
    now[0] = 160.0  # a's window is over (the store forgets its tombstone too)
    assert [u in seen for u in "ab"] == [False, True]
    seen.add("c")
    assert len(seen) == 2  # a dropped as it aged out
    seen.add("d")
    seen.add("e")  # past the limit: the oldest goes
    assert [u in seen for u in "bcde"] == [False, True, True, True]
    assert len(seen) == 3
