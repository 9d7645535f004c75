"""Random traces: the simulator over the real core equals the oracle's simulation exactly."""

from __future__ import annotations

from hypothesis import given

from celery_fair.sim import parse_trace, simulate
from reference import reference_simulate
from strategies import traces


def run(trace):
    return simulate(parse_trace(trace)).to_json()["jobs"]


@given(traces())
def test_every_start_and_finish_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(lifecycle=True))
def test_cost_lifecycle_options_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(max_jobs=60))
def test_larger_traces_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(runnable=True))
def test_every_job_runs_when_its_type_can_run(trace):
    assert all(job["start"] is not None for job in run(trace))


@given(traces(policies=True))
def test_weights_caps_and_pauses_by_key_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(policies=True, lifecycle=True, max_jobs=60))
def test_policies_with_the_cost_lifecycle_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(runnable=True, policies=True))
def test_every_job_runs_when_its_key_and_type_can_run_and_every_pause_ends(trace):
    assert all(job["start"] is not None for job in run(trace))


@given(traces(aging=True))
def test_aging_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(aging=True, policies=True, max_jobs=40))
def test_aging_with_weights_caps_and_pauses_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(aging=True, policies=True, lifecycle=True, max_jobs=40))
def test_aging_with_policies_and_the_cost_lifecycle_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(policies=True, allocation_caps=True))
def test_allocation_caps_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(runnable=True, policies=True, allocation_caps=True))
def test_allocation_caps_leave_no_job_unrun_that_could_run(trace):
    jobs = run(trace)
    assert jobs == reference_simulate(trace)
    assert all(j["start"] is not None for j in jobs)


@given(traces(aging=True, policies=True, lifecycle=True, allocation_caps=True, max_jobs=40))
def test_allocation_caps_with_aging_and_the_cost_lifecycle_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(policies=True, bounds=True))
def test_max_priority_by_key_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(aging=True, policies=True, bounds=True, max_jobs=40))
def test_max_priority_with_aging_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(policies=True, bounds=True, by_key=True))
def test_priority_scope_key_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(runnable=True, policies=True, bounds=True, by_key=True))
def test_priority_scope_key_leaves_no_job_unrun_that_could_run(trace):
    jobs = run(trace)
    assert jobs == reference_simulate(trace)
    assert all(j["start"] is not None for j in jobs)


@given(
    traces(
        aging=True,
        policies=True,
        lifecycle=True,
        allocation_caps=True,
        bounds=True,
        by_key=True,
        max_jobs=40,
    )
)
def test_priority_scope_key_with_aging_caps_and_the_cost_lifecycle_equals_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(policies=True, rates=True))
def test_rate_limits_by_key_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(runnable=True, policies=True, rates=True))
def test_rate_limits_leave_no_job_unrun_that_could_run(trace):
    assert all(job["start"] is not None for job in run(trace))


@given(traces(aging=True, policies=True, rates=True, bounds=True, lifecycle=True, max_jobs=40))
def test_rate_limits_with_aging_bounds_and_the_cost_lifecycle_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


# -- two-level keys (docs/design.md 5g): tenants first, then the keys within the tenant --
