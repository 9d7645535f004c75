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
            capacity=5,
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
    assert value(m, "celery_fair_capacity_slots") == 5
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
