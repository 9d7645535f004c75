"""Recording live traffic into a simulator trace, from task events (the command itself runs
against a real worker in tests/integration/test_fair_command.py)."""

from __future__ import annotations

import pytest

from celery_fair.core import JobType
from celery_fair.record import Recorder, parse_duration
from celery_fair.sim import parse_trace, simulate

TYPES = {
    "clone": JobType("clone", 8, max_concurrency=4, conflict_group="git", default_cost=10),
    "repack": JobType("repack", 4, conflict_group="git", default_cost=20),
}


def ev(kind, uuid, t, **fields):
    return {"type": kind, "uuid": uuid, "timestamp": t, **fields}


def fair(kind, uuid, t, **fields):
    keys = {"job_type": "clone", "fairness_key": "alice", "job_id": "linux"}
    return ev(kind, uuid, t, **keys, **fields)


def test_fair_jobs_that_arrived_and_ended_become_a_trace_the_simulator_replays():
    rec = Recorder()
    for event in [
        fair("task-received", "a", 100.0),
        ev("task-received", "plain", 100.5, name="plain"),  # no job_type: not a fair job
        fair("task-started", "a", 101.0),
        ev("task-received", "b", 102.0, job_type="repack", fairness_key="", job_id="git"),
        ev("task-succeeded", "a", 103.5, runtime=2.5),
        ev("task-started", "b", 103.5),
        ev("task-failed", "b", 108.0),  # no runtime in a failure: its start to its end
        fair("task-received", "c", 104.0),  # still waiting when the recording ends
        ev("worker-heartbeat", None, 104.0),
    ]:
        rec.event(event)
    trace = rec.trace(TYPES, capacity=4)
    assert trace["capacity"] == 4
    assert trace["types"] == {
        "clone": {"priority": 8, "max_concurrency": 4, "conflict_group": "git", "default_cost": 10},
        "repack": {"priority": 4, "conflict_group": "git", "default_cost": 20},
    }
    assert [(j["type"], j["fairness_key"], j["job_id"], j["arrival"], j["duration"])
            for j in trace["jobs"]] == [
        ("clone", "alice", "linux", 0.0, 2.5), ("repack", "", "git", 2.0, 4.5)
    ]  # fmt: skip
    assert rec.unfinished == 1
    assert rec.ignored == 1
    result = simulate(parse_trace(trace))  # what the simulator accepts, it replays
    assert [(j.start, j.finish) for j in result.jobs] == [(0.0, 2.5), (2.0, 6.5)]


def test_a_job_of_a_type_the_app_does_not_declare_is_left_out():
    rec = Recorder()
    rec.event(ev("task-received", "x", 1.0, job_type="unknown", fairness_key="k"))
    rec.event(ev("task-succeeded", "x", 2.0, runtime=1.0))
    assert rec.trace(TYPES, 2)["jobs"] == []


@pytest.mark.parametrize("text", ["", "0", "-5m", "10 minutes", "1d", "m"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration(text)
