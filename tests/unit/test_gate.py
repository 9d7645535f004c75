"""The worker's gate alone (gate_world.py): holding, admission order, conflicts, caps, the
simplest job control and the ack-timeout refresh, with no broker and no worker.

Job control in every place a job can be is in test_gate_control.py, spills in
test_gate_spill.py, the reserve and the pool's size in test_gate_reserve.py.
"""

from __future__ import annotations

import pytest
from gate_world import VISIBILITY_TIMEOUT, World

from celery_fair.worker.headers import REPUBLISHED, SUBMITTED, TOKEN
from celery_fair.worker.housekeeping import HOLD_FRACTION


def test_a_job_is_held_admitted_handed_to_the_pool_and_finished_with_its_token() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    assert w.pool.ids() == ["t1"]
    assert isinstance(first.request_dict[TOKEN], int)  # the fencing token travels with it
    assert w.gate.job_status("t1") == {"state": "running", "effective_priority": 8}

    second = w.deliver("t2", key="b")  # no free slot: held, unacknowledged
    assert w.pool.ids() == ["t1"]
    assert list(w.gate.held) == ["t2"]
    assert not second.acknowledged
    assert w.gate.job_status("t2")["state"] == "held"

    w.clock.advance(3.0)
    w.pool.finish(first)  # its slot frees: the held job starts
    assert first.acknowledged
    assert w.pool.ids() == ["t1", "t2"]
    assert not w.gate.held
    assert w.gate.pool_info()["fair-admitted"] == 2
    w.pool.finish(second)
    assert w.gate.pool_info()["fair-running"] == 0


def test_a_conflict_holds_the_second_job_until_the_first_finishes() -> None:
    w = World(slots=2)
    first = w.deliver("t1", key="a", job_id="repo-1")
    w.deliver("t2", key="b", job_id="repo-1")  # same repository: may not run beside it
    assert w.pool.ids() == ["t1"]  # though a slot is free
    status = w.gate.job_status("t2")
    assert status["blocked_by"] == ["conflict"]
    assert status["conflict"]  # names what it waits for
    w.deliver("t3", key="c", job_id="repo-2")  # another repository: takes the free slot
    assert w.pool.ids() == ["t1", "t3"]

    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3", "t2"]


def test_a_type_cap_holds_a_second_job_of_the_type_while_other_types_run() -> None:
    w = World(slots=3)
    first = w.deliver("d1", job_type="deploy", key="a")
    w.deliver("d2", job_type="deploy", key="b")
    w.deliver("b1", job_type="build", key="c")
    assert w.pool.ids() == ["d1", "b1"]
    assert w.gate.job_status("d2")["blocked_by"] == ["type_cap"]

    w.pool.finish(first)
    assert w.pool.ids() == ["d1", "b1", "d2"]


def test_cancel_drops_a_held_job_once_revoked_and_never_starts_it() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    held = w.deliver("t2", key="b")
    assert w.gate.cancel("t2") is None  # not in the revoked set: left alone
    assert "t2" in w.gate.held

    held.is_revoked = True  # fair_cancel puts it in Celery's revoked set first
    assert w.gate.cancel("t2") == "cancelled"
    assert not w.gate.held
    assert held.acknowledged
    assert held.events == ["task-revoked"]
    assert w.gate.cancel("t1") == "already_running"
    assert w.gate.cancel("nowhere") is None

    w.pool.finish(first)
    assert w.pool.ids() == ["t1"]  # the cancelled job never reached the pool


def test_reprioritize_moves_a_held_job_ahead_of_one_that_came_before_it() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    w.deliver("t2", key="b")
    w.clock.advance(1.0)
    w.deliver("t3", key="c")  # later than t2: it would start after it
    assert w.gate.reprioritize("t3", 9) == "ok"
    assert w.gate.job_status("t3")["priority"] == 9
    assert w.gate.reprioritize("t1", 9) == "already_running"

    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3"]


def test_a_priority_given_before_the_job_arrives_is_taken_on_arrival() -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    w.deliver("t2", key="b")
    assert w.gate.reprioritize("t3", 9) is None  # not here yet: remembered
    w.deliver("t3", key="c")
    w.pool.finish(first)
    assert w.pool.ids() == ["t1", "t3"]


def test_the_sweep_returns_a_message_held_past_the_ack_timeout_fraction() -> None:
    w = World(slots=1)
    max_hold = VISIBILITY_TIMEOUT * HOLD_FRACTION
    assert w.gate.max_hold == pytest.approx(max_hold)
    running = w.deliver("t1", key="a")
    held = w.deliver("t2", key="b")
    arrival = w.clock.now()

    w.clock.advance(max_hold - 1.0)
    w.gate.sweep()
    assert "t2" in w.gate.held
    assert not w.app.published

    w.clock.advance(2.0)
    w.gate.sweep()
    assert "t2" not in w.gate.held
    assert held.acknowledged  # acked only once its copy was published
    [copy] = w.app.published
    assert copy["routing_key"] == "celery"
    assert copy["headers"][REPUBLISHED] == 1
    assert copy["headers"][SUBMITTED] == pytest.approx(arrival)  # keeps its place
    assert w.gate.pool_info()["fair-refreshed"] == 1
    assert w.pool.ids() == ["t1"]
    assert not running.acknowledged


# -- copies (copies.py) ----------------------------------------------------------------------


def test_a_message_delivered_again_while_held_is_kept_once_at_its_first_place() -> None:
    w = World(slots=1)
    running = w.deliver("t1", key="a")
    first = w.deliver("t2", key="b")
    w.deliver("t3", key="c")
    # The broker delivers t2 again (its ack timeout ran out while it was held):
    again = w.deliver("t2", key="b")
    assert first.acknowledged
    assert not again.acknowledged
    assert list(w.gate.held) == ["t2", "t3"]  # at the place the first had
    assert w.gate.counters.counts["duplicates"] == 1
    w.pool.finish(running)
    assert w.pool.handed[-1] is again  # the kept delivery runs, once
    assert w.pool.ids() == ["t1", "t2"]


def test_a_message_delivered_again_while_its_job_runs_is_dropped() -> None:
    w = World(slots=2)
    running = w.deliver("t1", key="a")
    again = w.deliver("t1", key="a")
    assert again.acknowledged
    assert not w.gate.held
    assert w.pool.ids() == ["t1"]  # not handed a second time
    assert w.gate.counters.counts["duplicates"] == 1
    w.pool.finish(running)
    assert w.gate.pool_info()["fair-running"] == 0


def test_a_copy_of_a_job_that_ran_to_the_end_is_dropped_saying_where_it_ran(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World(slots=1)
    first = w.deliver("t1", key="a")
    w.run(first, 1.0)  # acknowledged: ended for good
    late = w.deliver("t1", key="a")  # a late copy (published twice, say)
    assert late.acknowledged
    assert not w.gate.held
    assert w.pool.ids() == ["t1"]  # the store answered DONE: it did not run again
    assert w.gate.counters.counts["duplicates"] == 1
    assert "already ran to the end on this worker" in caplog.text
