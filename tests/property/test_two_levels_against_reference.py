"""Random traces with two-level keys (``key_separator``): the simulator over the real core
equals the oracle's simulation exactly (a file of its own, so that a parallel run spreads
these beside tests/property/test_against_reference.py)."""

from __future__ import annotations

from hypothesis import given

from celery_fair.sim import parse_trace, simulate
from reference import reference_simulate
from strategies import traces


def run(trace):
    return simulate(parse_trace(trace)).to_json()["jobs"]


@given(traces(tenants=True))
def test_two_level_keys_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, policies=True, bounds=True))
def test_two_level_keys_with_policies_at_both_levels_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, policies=True, lifecycle=True, max_jobs=60))
def test_two_level_keys_with_the_cost_lifecycle_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, runnable=True, policies=True))
def test_two_level_keys_leave_no_job_unrun_that_could_run(trace):
    jobs = run(trace)
    assert jobs == reference_simulate(trace)
    assert all(j["start"] is not None for j in jobs)


@given(traces(tenants=True, aging=True, policies=True, bounds=True, lifecycle=True, max_jobs=40))
def test_two_level_keys_with_aging_bounds_and_the_cost_lifecycle_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, by_key=True, aging=True, policies=True, bounds=True, max_jobs=40))
def test_two_level_keys_with_priority_scope_key_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, policies=True, allocation_caps=True))
def test_two_level_keys_with_allocation_caps_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, runnable=True, policies=True, allocation_caps=True))
def test_two_level_allocation_caps_leave_no_job_unrun_that_could_run(trace):
    jobs = run(trace)
    assert jobs == reference_simulate(trace)
    assert all(j["start"] is not None for j in jobs)


@given(traces(tenants=True, aging=True, policies=True, allocation_caps=True, max_jobs=40))
def test_two_level_allocation_caps_with_aging_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)


@given(traces(tenants=True, policies=True, rates=True, max_jobs=40))
def test_two_level_keys_with_rates_by_key_and_type_equal_the_reference(trace):
    assert run(trace) == reference_simulate(trace)
