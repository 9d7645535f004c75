"""Job control on the gate alone (gate_world.py): what ``job_status``, ``cancel`` and
``reprioritize`` answer for each place a job can be (held, reserved, running, gone, not yet
here, a retry found by its task id), and what each does there.

The remote-control round trip (the command reaches the worker, the answer comes back named by
the worker, the client's words and the result backend's states) is
tests/integration/test_job_control.py's.
"""

from __future__ import annotations

import pytest
from gate_world import World, celery_revoke


def test_status_says_running_reserved_or_held_and_nothing_for_a_job_not_here() -> None:
    # Given one process running a job, one job admitted ahead of it (reserved) and one held,
    w = World(slots=1, lookahead=1)
    w.deliver("run", key="a")
    w.deliver("ahead", key="b")
    w.deliver("held", key="c")
    w.clock.advance(2.0)
    assert w.gate.job_status("run") == {"state": "running", "effective_priority": 8}
    assert w.gate.job_status("ahead") == {"state": "reserved", "waited": 2.0}
    held = w.gate.job_status("held")
    assert (held["state"], held["waited"], held["place"], held["held"]) == ("held", 2.0, 1, 2)
    assert w.gate.job_status("elsewhere") is None
    stats = w.stats()
    assert (stats["fair-running"], stats["fair-reserved"], stats["fair-held"]) == (1, 1, 2)


@pytest.mark.parametrize("shared", [False, True])
def test_status_of_a_held_job_gives_its_place_what_holds_it_in_words_and_its_wait(
    shared: bool,
) -> None:
    # Given one process running a clone of linux, and behind it another clone of linux (held
    # by the conflict) and a job of another repository (held for the slot),
    w = World(slots=1, shared=shared)
    w.deliver("long", key="a", job_id="linux")
    w.deliver("same", key="b", job_id="linux")
    w.deliver("other", key="c", job_id="git")
    # when the long job has run past its default cost of 1 s,
    w.clock.advance(5.0)
    same, other = w.gate.job_status("same"), w.gate.job_status("other")
    # then each is held with its place, its key and what holds it, in words,
    assert (same["state"], other["state"]) == ("held", "held")
    assert same["fairness_key"] == "b"
    assert same["why"][0] == "conflict on repo:linux held by task long for 5.0 s"
    assert same["blocked_by"] == ["capacity", "conflict"]
    assert same["conflict"]  # for job control to name its holder fleet-wide
    assert other["why"][0] == "every slot busy 1/1"
    assert {same["place"], other["place"]} == {1, 2}
    # and when it is expected to start: the long job's time left (none) and the job ahead's.
    assert 0 <= other["expected_wait"] <= 1.0 + 1e-9


def test_cancel_drops_a_reserved_job_refunds_its_key_and_never_starts_it() -> None:
    # Given one process busy, one job admitted ahead of it (its key charged in the store) and
    # one held (never admitted: never charged),
    w = World(slots=1, lookahead=1)
    long = w.deliver("long", key="a")
    ahead = w.deliver("ahead", key="b")
    held = w.deliver("held", key="c")
    assert w.gate.job_status("ahead")["state"] == "reserved"
    assert w.store.accumulated_cost("b") == 1.0
    # when each is cancelled (fair_cancel puts its id in Celery's revoked set first),
    ahead.is_revoked = held.is_revoked = long.is_revoked = True
    assert w.gate.cancel("long") == "already_running"
    assert w.gate.cancel("ahead") == "cancelled"
    assert w.gate.cancel("held") == "cancelled"
    # then the waiting ones are dropped as Celery drops a revoked message, the admitted one's
    # key refunded, the held one's never charged;
    assert (ahead.acknowledged, held.acknowledged) == (True, True)
    assert ahead.events == held.events == ["task-revoked"]
    assert w.store.accumulated_cost("b") == 0.0
    assert w.store.accumulated_cost("c") == 0.0
    assert not w.gate.held
    assert w.stats()["fair-reserved"] == 0
    # the running one runs on, and once done this worker no longer has it (nor the others).
    w.pool.finish(long)
    assert w.pool.ids() == ["long"]
    assert [w.gate.cancel(t) for t in ("long", "ahead", "held")] == [None, None, None]
    assert w.gate.job_status("long") is None


def test_a_job_revoked_while_reserved_leaves_at_the_sweep_refunded_and_never_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given one process busy and a job admitted behind it, reserved,
    w = World(slots=1, lookahead=1)
    busy = w.deliver("busy", key="a", job_id="r0")
    w.deliver("next", key="b", job_id="r1")
    assert (w.stats()["fair-reserved"], w.store.accumulated_cost("b")) == (1, 1.0)
    # when Celery's revoke puts it in the worker's revoked set (no fair_cancel),
    celery_revoke(monkeypatch, "next")
    # then the next sweep drops it and gives its place and its key's charge back,
    w.gate.sweep()
    assert "next" not in w.gate.held
    assert w.store.accumulated_cost("b") == 0.0
    assert (w.stats()["fair-reserved"], w.stats()["fair-running"]) == (0, 1)
    # and it never runs; the job after it does, and then nothing is counted as running.
    after = w.deliver("after", key="c", job_id="r2")
    w.pool.finish(busy)
    w.pool.finish(after)
    assert w.pool.ids() == ["busy", "after"]
    assert w.stats()["fair-running"] == 0


def test_a_held_retry_is_found_and_cancelled_by_its_task_id() -> None:
    # Given one process, a job whose first attempt ran and asked to be retried, and a long job
    # that took the process before the retry came back,
    w = World(slots=1, lookahead=1)
    first = w.deliver("flaky", key="b")
    w.pool.finish(first)
    long = w.deliver("long", key="a")
    # then the retry (a job of its own in the gate, under the same task id) waits there,
    # admitted ahead of the free process,
    retry = w.deliver("flaky", key="b", retries=1)
    assert w.gate.job_status("flaky") == {"state": "reserved", "waited": 0.0}
    # and a cancel by the task id finds it and drops it: it never runs again.
    retry.is_revoked = True
    assert w.gate.cancel("flaky") == "cancelled"
    assert retry.acknowledged
    assert w.gate.job_status("flaky") is None
    w.pool.finish(long)
    assert w.pool.ids() == ["flaky", "long"]
    assert w.pool.handed[0] is first


def test_reprioritize_takes_a_held_job_from_fifth_to_first_and_it_starts_first() -> None:
    # Given one process running a job of key a, and held behind it four jobs of keys that have
    # used nothing and, last, a job of a,
    w = World(slots=1)
    long = w.deliver("long", key="a")
    for i in range(4):
        w.deliver(f"bulk{i}", key=f"k{i}")
    w.deliver("late", key="a")
    before = w.gate.job_status("late")
    assert (before["place"], before["priority"]) == (5, 8)
    # when it is given priority 9,
    assert w.gate.reprioritize("late", 9) == "ok"
    # then it is first among the held jobs, at priority 9, and starts first when the slot frees;
    after = w.gate.job_status("late")
    assert (after["state"], after["place"], after["priority"]) == ("held", 1, 9)
    w.pool.finish(long)
    assert w.pool.ids() == ["long", "late"]
    # the running job answers already_running, one not here None (the client: unknown).
    assert w.gate.reprioritize("late", 8) == "already_running"
    assert w.gate.reprioritize("long", 9) is None  # done: not here any more


def test_reprioritize_of_a_reserved_job_is_already_running_and_changes_nothing() -> None:
    w = World(slots=1, lookahead=1)
    long = w.deliver("long", key="a")
    w.deliver("ahead", key="b")
    w.deliver("held", key="c")
    assert w.gate.reprioritize("ahead", 9) == "already_running"
    w.pool.finish(long)
    assert w.pool.ids() == ["long", "ahead"]


def test_a_priority_given_before_a_job_arrives_puts_it_first_when_it_does() -> None:
    # Given one process running a job of key a and three jobs of other keys held behind it,
    w = World(slots=1)
    long = w.deliver("long", key="a")
    for i in range(3):
        w.deliver(f"more{i}", key=f"k{i}")
    # when a job of a still on its way is given priority 9 (remembered: not here yet),
    assert w.gate.reprioritize("queued", 9) is None
    w.clock.advance(1.0)
    w.deliver("queued", key="a")
    # then it arrives first among the held jobs, at priority 9, and starts next.
    arrived = w.gate.job_status("queued")
    assert (arrived["place"], arrived["priority"]) == (1, 9)
    w.pool.finish(long)
    assert w.pool.ids() == ["long", "queued"]


def test_jobs_lists_what_runs_is_reserved_and_is_held_filtered_longest_first() -> None:
    # Given one process running a job of key a, one job of key b admitted ahead of it, and
    # three held (two of key a, delivered a second apart, and one of key c on a repository),
    w = World(slots=1, lookahead=1)
    w.deliver("run", key="a")
    w.deliver("ahead", key="b")
    w.deliver("held-a1", key="a")
    w.clock.advance(1.0)
    w.deliver("held-a2", key="a")
    w.deliver("held-c", key="c", job_id="linux")
    w.clock.advance(2.0)
    # then the worker lists them all, running first, then reserved, then held, longest first,
    found, matched = w.gate.jobs()
    assert [(j["task_id"], j["state"]) for j in found] == [
        ("run", "running"),
        ("ahead", "reserved"),
        ("held-a1", "held"),
        ("held-a2", "held"),
        ("held-c", "held"),
    ]
    assert matched == 5
    held_c = found[-1]
    assert (held_c["fairness_key"], held_c["type"], held_c["job_id"]) == ("c", "build", "linux")
    assert (held_c["waited"], found[2]["waited"], found[0]["running"]) == (2.0, 3.0, 3.0)
    assert held_c["priority"] == 8
    # by key, by state and by type, and no more than asked, with how many matched;
    assert [j["task_id"] for j in w.gate.jobs(key="a")[0]] == ["run", "held-a1", "held-a2"]
    assert [j["task_id"] for j in w.gate.jobs(state="held", key="a")[0]] == ["held-a1", "held-a2"]
    assert [j["task_id"] for j in w.gate.jobs(state="reserved")[0]] == ["ahead"]
    assert w.gate.jobs(type="other") == ([], 0)
    assert ([j["task_id"] for j in w.gate.jobs(limit=2)[0]], w.gate.jobs(limit=2)[1]) == (
        ["run", "ahead"],
        5,
    )
    # and a job that ended is listed no more.
    w.pool.finish(w.pool.running()[0])
    assert "run" not in [j["task_id"] for j in w.gate.jobs()[0]]


def test_jobs_lists_a_held_job_at_the_priority_its_keys_bound_gave_it() -> None:
    # Given key a bounded to priority 4 and a held job of a type of priority 8,
    w = World(slots=1, fair_keys={"a": {"max_priority": 4}})
    w.deliver("run", key="b")
    w.deliver("held", key="a")
    # then the list shows the priority it waits at, not its type's.
    (held,) = w.gate.jobs(state="held")[0]
    assert (held["task_id"], held["priority"]) == ("held", 4)
    assert w.gate.jobs(state="running")[0][0]["priority"] == 8
