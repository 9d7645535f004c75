"""The worker's Prometheus metrics, fed events and a look at a gate, read from its registry
(a real worker serves them over HTTP in tests/integration/test_metrics.py)."""

from __future__ import annotations

import sys

import pytest
from prometheus_client import CollectorRegistry

import celery_fair
from celery_fair.errors import ConfigurationError
from celery_fair.metrics import GateLook, WorkerMetrics, prometheus


def value(metrics: WorkerMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_events_move_the_counters_and_histograms_by_bounded_labels():
    m = WorkerMetrics(worker="w1@host")
    for wait in (0.002, 0.3, 42.0):
        m.admitted("clone", 8, wait)
        m.started("clone", 8)
    m.finished("clone", 8, 1.5)
    m.finished("clone", 8, None)
    m.blocked("clone", 8, "conflict")
    m.decided(0.00004, 2)
    m.store_call("admit", 0.0012, True)
    m.store_call("beat", 5.0, False)
    m.spilled(7)
    m.refreshed()
    m.duplicate()
    m.dropped()
    m.revoked_held()
    m.moved("celery", 500)
    m.controlled("cancel", "cancelled")
    m.controlled("reprioritize", "elsewhere")
    m.controlled("reprioritize", "elsewhere")
    clone = {"job_type": "clone", "tier": "8"}
    assert value(m, "celery_fair_queue_wait_seconds_count", **clone) == 3
    assert value(m, "celery_fair_queue_wait_seconds_bucket", le="0.005", **clone) == 1
    assert value(m, "celery_fair_queue_wait_seconds_bucket", le="60.0", **clone) == 3
    assert value(m, "celery_fair_started_total", **clone) == 3
    assert value(m, "celery_fair_job_duration_seconds_sum", job_type="clone") == 1.5
    assert value(m, "celery_fair_released_total", job_type="clone") == 1
    assert value(m, "celery_fair_refused_total", job_type="clone", reason="conflict") == 1
    assert value(m, "celery_fair_decision_duration_seconds_bucket", le="5e-05") == 1
    assert value(m, "celery_fair_store_call_duration_seconds_count", kind="admit") == 1
    assert value(m, "celery_fair_store_errors_total", kind="beat") == 1
    assert value(m, "celery_fair_store_errors_total", kind="admit") is None
    assert value(m, "celery_fair_returned_total", reason="spill") == 7
    assert value(m, "celery_fair_returned_total", reason="ack_timeout") == 1
    assert value(m, "celery_fair_dropped_total", reason="duplicate") == 2
    assert value(m, "celery_fair_dropped_total", reason="revoked") == 1
    assert value(m, "celery_fair_intake_moved_total", queue="celery") == 500
    control = "celery_fair_job_control_total"
    assert value(m, control, operation="cancel", answer="cancelled") == 1
    assert value(m, control, operation="reprioritize", answer="elsewhere") == 2
    assert value(m, control, operation="reprioritize", answer="ok") is None
    [info] = [s for f in m.registry.collect() for s in f.samples if s.name.endswith("_info")]
    assert info.labels["worker"] == "w1@host"
    assert info.labels["version"] == celery_fair.__version__


def test_gauges_are_read_from_the_gate_at_each_scrape():
    looks = [
        GateLook(
            held={("clone", 8): 3, ("repack", 2): 1},
            running={("clone", 8): 2},
            blocked={"conflict": 2, "type_cap": 1, "tier_cap": 0, "capacity": 1, "admissible": 0},
            reserved=1,
            plain_running=1,
            slots=4,
            lookahead=1,
            mode="hold",
        ),
        GateLook(mode="shared"),
    ]
    m = WorkerMetrics(look=lambda: looks[0], registry=CollectorRegistry())
    assert value(m, "celery_fair_held_jobs", job_type="clone", tier="8") == 3
    assert value(m, "celery_fair_held_jobs", job_type="repack", tier="2") == 1
    assert value(m, "celery_fair_blocked_jobs", reason="conflict") == 2
    assert value(m, "celery_fair_running_jobs", job_type="clone", tier="8") == 2
    assert value(m, "celery_fair_reserved_jobs") == 1
    assert value(m, "celery_fair_plain_running_jobs") == 1
    # the pool's slots and the reserve's depth apart, not their sum
    assert value(m, "celery_fair_capacity_slots") == 4
    assert value(m, "celery_fair_lookahead_jobs") == 1
    assert value(m, "celery_fair_store_mode", mode="hold") == 1
    assert value(m, "celery_fair_store_mode", mode="shared") == 0
    looks.pop(0)  # the next scrape reads the gate again
    assert value(m, "celery_fair_held_jobs", job_type="clone", tier="8") is None
    assert value(m, "celery_fair_store_mode", mode="shared") == 1


def test_two_workers_metrics_in_one_process_do_not_collide():
    one, two = WorkerMetrics(), WorkerMetrics()
    one.started("clone", 8)
    assert value(two, "celery_fair_started_total", job_type="clone", tier="8") is None


def test_metrics_without_prometheus_client_is_a_configuration_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'celery-fair\[metrics\]'"):
        prometheus()


def test_the_keys_waiting_longest_are_named_and_the_longest_of_the_rest_is_other():
    heads = {"a": 3.0, "b": 12.0, "c": 0.5, "d": 7.0}
    look = GateLook(heads=heads)
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry(), top_keys=2)
    assert value(m, "celery_fair_key_head_wait_seconds", key="b") == 12.0
    assert value(m, "celery_fair_key_head_wait_seconds", key="d") == 7.0
    assert value(m, "celery_fair_key_head_wait_seconds", key="other") == 3.0
    assert value(m, "celery_fair_key_head_wait_seconds", key="a") is None
    # With none to name, every key is other; with none held, no sample at all.
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry(), top_keys=0)
    assert value(m, "celery_fair_key_head_wait_seconds", key="other") == 12.0
    assert value(m, "celery_fair_key_head_wait_seconds", key="b") is None
    look = GateLook()
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry())
    samples = [s for f in m.registry.collect() for s in f.samples]
    assert not [s for s in samples if s.name == "celery_fair_key_head_wait_seconds"]


def test_a_key_named_other_among_the_top_counts_with_the_rest():
    from celery_fair.metrics import head_waits

    assert head_waits({"other": 9.0, "a": 5.0, "b": 1.0}, 2) == [("a", 5.0), ("other", 9.0)]


def test_the_keys_with_the_most_slots_are_named_and_the_rest_summed_as_other():
    look = GateLook(allocation={"a": 1, "b": 9, "c": 4, "d": 2})
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry(), top_keys=2)
    assert value(m, "celery_fair_key_allocation_slots", key="b") == 9
    assert value(m, "celery_fair_key_allocation_slots", key="c") == 4
    assert value(m, "celery_fair_key_allocation_slots", key="other") == 3
    assert value(m, "celery_fair_key_allocation_slots", key="a") is None


def test_each_keys_head_wait_counts_from_its_publish_or_its_keys_last_start_here():
    from celery_fair.worker.events import HeadWaits

    heads = HeadWaits(size=2)
    # a key's first job: from its publish (time in the broker included)
    assert heads.started("a", arrival=100.0, now=103.0) == 3.0
    # the next, published before that start: from it; one published after: from its publish
    assert heads.started("a", arrival=101.0, now=104.5) == 1.5
    assert heads.started("a", arrival=110.0, now=110.25) == 0.25
    # only the latest `size` keys are kept: a forgotten key counts from the publish again
    heads.started("b", 0.0, 111.0)
    heads.started("c", 0.0, 112.0)
    assert heads.started("a", arrival=105.0, now=113.0) == 8.0


def test_the_head_wait_histogram_names_the_first_keys_for_good_and_the_rest_as_other():
    m = WorkerMetrics(registry=CollectorRegistry(), top_keys=2)
    for key, wait in [("a", 0.01), ("b", 3.0), ("c", 0.2), ("a", 0.02), ("other", 1.0)]:
        m.head_waited(key, wait)
    got = {
        (s.name, s.labels.get("key"), s.labels.get("le")): s.value
        for family in m.registry.collect()
        if family.name == "celery_fair_key_head_wait_to_start_seconds"
        for s in family.samples
    }
    name = "celery_fair_key_head_wait_to_start_seconds"
    assert got[(f"{name}_count", "a", None)] == 2
    assert got[(f"{name}_count", "b", None)] == 1
    assert got[(f"{name}_count", "other", None)] == 2  # c, and a key that is named "other"
    assert (f"{name}_count", "c", None) not in got
    assert got[(f"{name}_bucket", "b", "2.5")] == 0
    assert got[(f"{name}_bucket", "b", "5.0")] == 1


def test_seed_001s_views_are_read_from_the_gate_the_utilization_of_the_keys_named():
    look = GateLook(
        allocation={"a": 3, "b": 1, "c": 1},
        running_by_key={"a": 3, "b": 0, "c": 2},
        redistributed=0.5,
        levels={8: 4, 9: 1},
    )
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry(), top_keys=1)
    assert value(m, "celery_fair_key_allocation_utilization", key="a") == 1.0
    assert value(m, "celery_fair_key_allocation_utilization", key="other") == 1.0  # 2 of 2
    assert value(m, "celery_fair_allocation_redistributed_slots") == 0.5
    assert value(m, "celery_fair_pending_effective_priority_jobs", priority="8") == 4
    assert value(m, "celery_fair_pending_effective_priority_jobs", priority="9") == 1
    m.allocation_changed("a", 0, 3)
    m.allocation_changed("a", 3, 2)
    assert value(m, "celery_fair_allocation_changes_total") == 2


def test_with_two_level_keys_the_tenants_with_most_jobs_are_named_and_the_rest_is_other():
    look = GateLook(
        tenants={"acme": (3, 40, 12.5), "beta": (1, 2, 4.0), "gamma": (0, 1, 2.0), "d": (1, 0, 9.0)}
    )
    m = WorkerMetrics(look=lambda: look, registry=CollectorRegistry(), top_keys=1)
    assert value(m, "celery_fair_tenant_running_jobs", tenant="acme") == 3
    assert value(m, "celery_fair_tenant_held_jobs", tenant="acme") == 40
    assert value(m, "celery_fair_tenant_accumulated_cost", tenant="acme") == 12.5
    # the rest together: their jobs summed, the least of their costs; never a raw key
    assert value(m, "celery_fair_tenant_running_jobs", tenant="other") == 2
    assert value(m, "celery_fair_tenant_held_jobs", tenant="other") == 3
    assert value(m, "celery_fair_tenant_accumulated_cost", tenant="other") == 2.0
    assert value(m, "celery_fair_tenant_running_jobs", tenant="beta") is None
    # flat keys: no tenant gauge at all
    flat = GateLook()
    m = WorkerMetrics(look=lambda: flat, registry=CollectorRegistry())
    names = {s.name for f in m.registry.collect() for s in f.samples}
    assert not {n for n in names if n.startswith("celery_fair_tenant_")}
