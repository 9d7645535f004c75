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


def test_arrivals_are_the_submission_times_so_a_burst_stays_a_burst():
    # Given a burst of 60 jobs published within 0.5 s, which a worker received over 23 s (it
    # holds about a window of them; the rest waited in the broker),
    rec = Recorder()
    for i in range(60):
        submitted = 1000.0 + i * 0.5 / 59
        received = 1000.2 + i * 23.0 / 59
        rec.event(fair("task-received", f"j{i}", received, submitted=submitted))
        rec.event(ev("task-succeeded", f"j{i}", received + 1.0, runtime=0.3))
    rec.event(fair("task-received", "late", 1030.0))  # published without the header
    rec.event(ev("task-succeeded", "late", 1031.0, runtime=0.3))
    rec.event(fair("task-received", "skewed", 1031.0, submitted=1040.0))  # a clock ahead
    rec.event(ev("task-succeeded", "skewed", 1032.0, runtime=0.3))
    arrivals = [j["arrival"] for j in rec.trace(TYPES, capacity=4)["jobs"]]
    # then the trace's arrivals are when they were published, not when they were received,
    assert arrivals[:60] == pytest.approx([i * 0.5 / 59 for i in range(60)], abs=1e-6)
    assert arrivals[60:] == [30.0, 31.0]  # its receipt; never after its receipt


def test_the_policies_in_force_go_into_the_trace_and_the_replay_honours_them():
    # Given fair_keys, a runtime weight on top, a key paused from before the first arrival
    # until 5 s into it and a type paused from 8 s on, and settings the simulator models,
    from celery_fair.core import Aging, KeyPolicies
    from celery_fair.record import settings_config
    from celery_fair.settings import FairSettings

    settings = FairSettings.from_celery_conf(
        {
            "fair_keys": {"alice": {"weight": 2}, "ci:*": {"max_concurrency": 1}},
            "fair_tier_caps": {8: 3},
            "fair_aging": {"interval": 10, "grace": 30},
            "fair_alpha": 0.5,
        }
    )
    rec = Recorder()
    rec.policies(90.0, {"keys": {"bob": {"weight": 3}}, "paused_keys": ["bob"]})
    rec.event(fair("task-received", "a", 100.0, submitted=100.0))
    rec.event(ev("task-succeeded", "a", 101.0, runtime=1.0))
    bob = {"job_type": "clone", "fairness_key": "bob", "job_id": "git"}
    rec.event(ev("task-received", "b", 100.0, submitted=100.0, **bob))
    rec.event(ev("task-succeeded", "b", 106.0, runtime=1.0))
    rec.policies(105.0, {"keys": {}, "paused_keys": [], "paused_types": []})
    rec.policies(108.0, {"keys": {}, "paused_types": ["clone", "repack"]})  # repack: no jobs
    trace = rec.trace(TYPES, 2, settings_config(settings), settings.keys)
    # then the trace carries them (the runtime key policies as first seen),
    assert trace["keys"] == {
        "alice": {"weight": 2.0},
        "ci:*": {"max_concurrency": 1},
        "bob": {"weight": 3},
    }
    assert trace["pauses"] == [
        {"key": "bob", "at": 0.0, "until": 5.0},
        {"type": "clone", "at": 8.0},
    ]
    assert trace["tier_caps"] == {"8": 3}
    assert Aging.from_mapping(trace["aging"]) == settings.aging
    assert trace["alpha"] == 0.5
    assert KeyPolicies.from_mapping(trace["keys"]).for_key("alice").weight == 2.0
    # and the simulator replays it as it was: bob's job starts when its pause ends.
    result = simulate(parse_trace(trace))
    assert [(j.name, j.start) for j in result.jobs] == [("clone:0", 0.0), ("clone:1", 5.0)]
