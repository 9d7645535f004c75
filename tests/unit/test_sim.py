"""The simulator's semantics, its validation of traces and its output."""

from __future__ import annotations

import json

import pytest

from celery_fair.errors import TraceError
from celery_fair.sim import bundled_examples, format_table, load_bundled, parse_trace, simulate


def trace(jobs, capacity=2, **extra):
    types = extra.pop("types", {"t": {"priority": 8, "conflict_group": "g"}, "bg": {"priority": 4}})
    return {"capacity": capacity, "types": types, "jobs": jobs, **extra}


def job(name, arrival=0, duration=1, **kw):
    return {
        "name": name,
        "type": "t",
        "job_id": name,
        "fairness_key": "k",
        "arrival": arrival,
        "duration": duration,
        **kw,
    }


def run(data):
    return simulate(parse_trace(data, warn=lambda m: None))


def starts(data):
    return {j.name: (j.start, j.finish) for j in run(data).jobs}


def test_completions_at_an_instant_free_slots_for_arrivals_at_that_instant():
    out = starts(trace([job("a", 0, 5), job("b", 0, 5), job("c", 5, 1)]))
    assert out["c"] == (5, 6)


def test_zero_duration_jobs_finish_and_free_their_slot_in_the_same_instant():
    out = starts(trace([job("a", 0, 0), job("b", 0, 0), job("c", 0, 3)], capacity=1))
    assert out == {"a": (0, 0), "b": (0, 0), "c": (0, 3)}


def test_a_job_that_can_never_run_gets_null_start_and_finish():
    data = trace([job("a")], types={"t": {"priority": 8, "max_concurrency": 0}})
    result = run(data).to_json()
    assert result["jobs"] == [{"name": "a", "start": None, "finish": None}]
    assert result["summary"]["keys"]["k"]["never_started"] == 1


def test_learned_estimates_steer_later_admissions():
    # Key x's jobs take 10, key y's take 1; after one observation each, y leads by far.
    jobs = [
        {
            "name": f"{key}{i}",
            "type": "t",
            "job_id": key,
            "fairness_key": key,
            "arrival": 0,
            "duration": 10 if key == "x" else 1,
        }
        for i in range(4)
        for key in "xy"
    ]
    out = run(trace(jobs, capacity=1, types={"t": {"priority": 8}}))
    order = [j.name for j in sorted(out.jobs, key=lambda j: j.start)]
    assert order[:2] == ["x0", "y0"]
    assert order[-1] == "x3"


def test_summary_counts_waits_and_slot_share_per_key():
    jobs = [
        {"name": "a", "type": "t", "job_id": "1", "fairness_key": "p", "arrival": 0, "duration": 3},
        {"name": "b", "type": "t", "job_id": "2", "fairness_key": "p", "arrival": 0, "duration": 3},
        {"name": "c", "type": "t", "job_id": "3", "fairness_key": "q", "arrival": 1, "duration": 2},
    ]
    summary = run(trace(jobs, capacity=1)).summary
    # a: 0-3, c: 3-5 (q at 0 beats p at 1), b: 5-8
    assert summary["makespan"] == 8
    assert summary["keys"]["p"] == {
        "jobs": 2,
        "started": 2,
        "never_started": 0,
        "wait_p50": 0,
        "wait_p99": 5,
        "wait_max": 5,
        "slot_time": 6,
        "slot_share": 0.75,
    }
    assert summary["keys"]["q"]["wait_max"] == 2


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda t: t.update(capacity=-1), "capacity"),
        (lambda t: t["types"]["t"].pop("priority"), r"types\['t'\].priority: required"),
        (lambda t: t["types"]["t"].update(priority=0), "priority must be a positive int"),
        (lambda t: t["jobs"][0].update(type="nope"), r"jobs\[0\].type"),
        (lambda t: t["jobs"][0].update(duration=-1), r"jobs\[0\].duration"),
        (lambda t: t["jobs"][0].update(arrival="soon"), r"jobs\[0\].arrival"),
        (lambda t: t["jobs"][0].update(cost=float("nan")), r"jobs\[0\].cost"),
        (lambda t: t["jobs"][1].update(name="a"), "unique"),
        (lambda t: t["jobs"][0].update(job_id=7), r"jobs\[0\].job_id"),
        (lambda t: t.update(alpha=2), "alpha"),
        (lambda t: t.update(jobs={}), "jobs: must be a list"),
        (lambda t: t.update(lifecycle={"cost_ttl": -5}), "cost_ttl"),
        (lambda t: t.update(keys={"k": {"weight": 0}}), "policy 'k': weight must be a positive"),
        (lambda t: t.update(keys={"k": {"cap": 1}}), r"keys: key policy 'k': unknown option"),
        (lambda t: t.update(pauses=[{"at": 1}]), r"pauses\[0\]: give exactly one of"),
        (lambda t: t.update(pauses=[{"key": "k", "type": "t", "at": 1}]), "exactly one"),
        (lambda t: t.update(pauses=[{"type": "nope", "at": 1}]), r"pauses\[0\].type"),
        (lambda t: t.update(pauses=[{"key": "k", "at": 5, "until": 2}]), "before at"),
        (lambda t: t.update(pauses=[{"key": "k"}]), r"pauses\[0\].at"),
    ],
)
def test_bad_traces_are_refused_with_a_message_naming_the_field(mutate, message):
    data = trace([job("a"), job("b")])
    mutate(data)
    with pytest.raises(TraceError, match=message):
        parse_trace(data, warn=lambda m: None)


def test_unknown_fields_are_reported_and_ignored():
    warnings = []
    data = trace([job("a", colour="red")])
    parse_trace(data, warn=warnings.append)
    assert warnings == ["jobs[0]: unknown field 'colour' ignored"]


def test_table_lists_every_job_and_every_key():
    data = trace([job("a"), {**job("b"), "fairness_key": ""}])
    text = format_table(parse_trace(data), run(data))
    assert "(background)" in text
    assert "makespan: 1" in text
    assert [line.split()[0] for line in text.splitlines()[2:4]] == ["a", "b"]


def test_bundled_git_hosting_example_runs_every_job():
    assert "git-hosting" in bundled_examples()
    result = run(load_bundled("git-hosting")).to_json()
    assert all(j["start"] is not None for j in result["jobs"])
    json.dumps(result)  # serialisable as is


def test_the_json_output_is_to_json_one_job_per_line():
    import io

    trace = parse_trace(load_bundled("git-hosting"))
    result = simulate(trace)
    out = io.StringIO()
    result.write_json(out)
    text = out.getvalue()
    assert json.loads(text) == result.to_json()
    assert text.count("\n") >= len(result.jobs) + 3  # a line per job, for diffs and grep


def test_each_json_line_is_what_the_json_module_writes_for_that_job():
    """write_json makes its lines itself (for speed): they must be json.dumps's, byte for byte,
    for every kind of value a job's outcome holds."""
    import io

    from celery_fair.sim import JobOutcome, SimResult

    jobs = (
        JobOutcome("plain", 0.1 + 0.2, 1e-07),
        JobOutcome('quote " and \\ and é and \n', 0, 3),  # ints: a trace's whole seconds
        JobOutcome("never", None, None),
        JobOutcome("aged", 12.5, 1e22, effective_priority=9),
        JobOutcome("", 1.0, None, effective_priority=0),
    )
    for result in (SimResult(jobs, {"makespan": 3}), SimResult((), {"makespan": None})):
        out = io.StringIO()
        result.write_json(out)
        text = out.getvalue()
        assert json.loads(text) == result.to_json()
        lines = text.splitlines()
        assert lines[:2] == ["{", ' "jobs": [']
        expected = [f"  {json.dumps(j.to_json())}," for j in result.jobs]
        if expected:
            expected[-1] = expected[-1][:-1]
        assert lines[2 : 2 + len(expected)] == expected
        assert lines[2 + len(expected)] == " ],"


def weighted_trace():
    """Weights 3 and 1 on one slot, ``small`` paused from 10 to 20 (docs/simulator.md shows a
    shorter one, which tests/unit/test_doc_references.py runs)."""
    jobs = []
    for key in ("big", "small"):
        for i in range(30):
            jobs.append(
                {"name": f"{key}:{i}", "type": "job", "fairness_key": key, "arrival": 0,
                 "duration": 1}
            )  # fmt: skip
    return {
        "capacity": 1,
        "types": {"job": {"priority": 8}},
        "keys": {"big": {"weight": 3}, "tenant:*": {"max_concurrency": 1}},
        "pauses": [{"key": "small", "at": 10, "until": 20}],
        "jobs": jobs,
    }


def test_weights_share_the_slot_and_a_pause_holds_a_key_until_it_ends():
    got = {j.name: j.start for j in run(weighted_trace()).jobs}
    order = sorted(got, key=lambda name: got[name])
    before = [n.split(":")[0] for n in order if got[n] < 8]
    assert before.count("big") == 3 * before.count("small")  # 3:1 while both have work
    assert all(n.startswith("big") for n in order if 10 <= got[n] < 20)  # small is paused
    # Resumed, small has been charged less while paused (big was charged 10/3 meanwhile), so
    # it goes first until the costs meet again: 3 jobs at 1 each.
    after = [n.split(":")[0] for n in order if got[n] >= 20][:4]
    assert after == ["small", "small", "small", "big"]


def test_a_key_cap_of_zero_and_a_pause_that_never_ends_leave_jobs_unstarted():
    data = trace(
        [job("a", fairness_key="capped"), job("b", fairness_key="held"), job("c")],
        keys={"capped": {"max_concurrency": 0}},
        pauses=[{"key": "held", "at": 0}],
    )
    assert starts(data) == {"a": (None, None), "b": (None, None), "c": (0, 1)}


@pytest.mark.parametrize(("caps", "renders"), [(False, [0, 1, 2]), (True, [0, 0, 2])])
def test_allocation_caps_give_each_key_its_share_of_the_slots_at_once(caps, renders):
    jobs = [job(f"render-{i}", duration=10, cost=10, fairness_key="render") for i in range(3)]
    jobs += [job(f"thumb-{i}", duration=1, cost=1, fairness_key="thumbs") for i in range(5)]
    data = trace(jobs, capacity=4, types={"job": {"priority": 8}}, allocation_caps=caps)
    for j in data["jobs"]:
        j["type"] = "job"
    got = {j.name: j.start for j in simulate(parse_trace(data)).jobs}
    assert [got[f"render-{i}"] for i in range(3)] == renders
    assert sorted(got.values()).count(0) == 4  # no slot idles either way


def test_allocation_caps_must_be_true_or_false():
    with pytest.raises(TraceError, match="allocation_caps must be True or False"):
        parse_trace(trace([job("a")], allocation_caps="yes"))


def test_a_key_out_of_its_rate_starts_again_when_its_bucket_refills_with_nothing_else_going_on():
    # One slot, a key at 1 job a second and 2 at once, nothing else: the simulator steps to
    # each refill, though no job comes or goes then (a key charged by cost waits longer).
    data = trace(
        [job(f"a{i}", duration=0.1, job_id=None) for i in range(4)]
        + [job(f"c{i}", duration=0.1, job_id=None, fairness_key="dear", cost=3) for i in range(2)],
        capacity=1,
        keys={"k": {"rate": "1/s", "burst": 2}, "dear": {"rate": "1/s", "per": "cost"}},
    )
    got = starts(data)
    assert [got[f"a{i}"][0] for i in range(4)] == pytest.approx([0, 0.2, 1, 2])  # c0 at 0.1
    assert got["c1"][0] - got["c0"][0] == pytest.approx(3)
