"""celery_fair.flower without a running Flower: the hooks on the installed Flower and Celery,
failing soft, and the fleet metrics of a store document (a real Flower runs in
tests/e2e/test_flower.py)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from celery.events.state import State
from prometheus_client import CollectorRegistry

from celery_fair import flower as helper
from celery_fair.fleet import jain_index
from celery_fair.worker.events import EVENT_FIELDS


def test_loading_the_helper_shows_the_fair_fields_of_task_events():
    assert helper.install() == {"task_fields": True, "columns": True, "metrics": True}
    # A task's events, as Celery's event state (Flower's) keeps them,
    state = State()
    fields = {"fairness_key": "tenant-7", "job_type": "clone", "job_id": "linux", "shard": "s"}
    state.event({"type": "task-received", "uuid": "t1", "name": "clone", "timestamp": 1.0,
                 "clock": 1, "local_received": 1.0, "hostname": "w1", **fields})  # fmt: skip
    state.event({"type": "task-started", "uuid": "t1", "timestamp": 2.0, "clock": 2,
                 "local_received": 2.0, "hostname": "w1", "queue_wait": 0.75,
                 "fencing_token": 42, **fields})  # fmt: skip
    task = state.tasks["t1"]
    # come out in what Flower's task page, /api/tasks and /api/task/info show.
    shown = task.as_dict()
    assert {k: shown[k] for k in fields} == fields
    assert shown["queue_wait"] == 0.75
    assert shown["fencing_token"] == 42
    assert shown["state"] == "STARTED"  # standard events only: the state is Celery's
    # A task from a plain worker has the fields, empty.
    state.event({"type": "task-received", "uuid": "t2", "name": "plain", "timestamp": 1.0,
                 "clock": 3, "local_received": 1.0, "hostname": "w1"})  # fmt: skip
    assert all(state.tasks["t2"].as_dict()[f] is None for f in EVENT_FIELDS)


def test_the_fair_fields_are_columns_of_flowers_tasks_page():
    from flower.views.tasks import TASK_COLUMNS, visible_task_columns

    assert set(EVENT_FIELDS) <= set(TASK_COLUMNS)
    shown = [slug for slug, _ in visible_task_columns(helper.tasks_columns)]
    assert shown[:6] == ["name", "uuid", "state", "fairness_key", "job_type", "job_id"]


def test_the_pages_show_the_waits_as_flower_shows_a_run_time_and_the_api_keeps_numbers():
    import copy
    import time

    helper.install()
    state = State()
    submitted = time.mktime((2024, 5, 1, 9, 30, 15, 0, 0, -1)) + 0.25
    state.event({"type": "task-started", "uuid": "t1", "timestamp": 2.0, "clock": 2,
                 "local_received": 2.0, "hostname": "w1", "queue_wait": 0.012345,
                 "publish_wait": 83.4, "submitted": submitted})  # fmt: skip
    task = state.tasks["t1"]
    # Flower hands format_task a copy for its pages (views only: the API does not call it),
    shown = helper.format_task(copy.copy(task)).as_dict()
    assert (shown["queue_wait"], shown["publish_wait"]) == ("12.35 ms", "1:23")
    assert shown["submitted"] == "2024-05-01 09:30:15.250"
    assert task.as_dict()["queue_wait"] == 0.012345  # the task itself keeps its numbers
    # and the star import sets Flower's option (a module-level name Flower reads).
    namespace: dict[str, object] = {}
    exec("from celery_fair.flower import *", namespace)
    assert namespace["format_task"] is helper.format_task


def test_a_hook_whose_names_moved_is_logged_once_and_the_others_still_apply(monkeypatch, caplog):
    import flower.views.tasks

    monkeypatch.delattr(flower.views.tasks, "TASK_COLUMNS")  # as if Flower renamed it
    monkeypatch.setattr(helper, "INSTALLED", {"task_fields": True, "metrics": True})
    with caplog.at_level(logging.WARNING, logger="celery_fair.flower"):
        assert helper.install()["columns"] is False
    [record] = caplog.records
    assert "could not add columns to Flower" in record.getMessage()
    assert "Flower works without them" in record.getMessage()


STATE = {
    "workers": [{"worker": "w1"}, {"worker": "w2"}],
    "tiers": {"8": 5, "2": 1},
    "types": {"clone": 5, "repack": 1},
    "conflicts": {"git\x1flinux": "t1"},
    "jobs": [{"fairness_key": k} for k in ["a", "a", "a", "b", "", "c"]],
    "costs": {"a": 30.0, "b": 10.0, "": 0.0, "c": 20.0},
    "lanes": {"size": 4, "keys": {"a": 0, "b": 1, "d": 1}},
}


def samples(state, top):
    registry = CollectorRegistry()

    class One:
        def collect(self):
            return helper.fleet_metrics(
                state, {8: 6, 2: None}, {"clone": 5, "repack": None}, top, tiers=(4,)
            )

    registry.register(One())
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in registry.collect()
        for s in f.samples
    }


def test_fleet_metrics_name_the_top_keys_and_sum_the_rest_as_other():
    got = samples(STATE, top=2)
    assert got[("celery_fair_fleet_workers", ())] == 2
    assert got[("celery_fair_fleet_running_jobs_by_tier", (("tier", "8"),))] == 5
    assert got[("celery_fair_fleet_tier_cap", (("tier", "8"),))] == 6
    assert ("celery_fair_fleet_tier_cap", (("tier", "2"),)) not in got  # no cap
    assert got[("celery_fair_fleet_running_jobs_by_type", (("job_type", "clone"),))] == 5
    assert got[("celery_fair_fleet_type_cap", (("job_type", "clone"),))] == 5
    assert got[("celery_fair_fleet_conflicts_held", ())] == 1
    assert got[("celery_fair_fleet_lanes", ())] == 4
    assert got[("celery_fair_fleet_lanes_in_use", ())] == 2  # b and d share lane 1
    assert got[("celery_fair_fleet_keys_in_lanes", ())] == 3
    by_key = {dict(labels)["fairness_key"]: v for (n, labels), v in got.items()
              if n == "celery_fair_fleet_running_jobs_by_key"}  # fmt: skip
    # a runs 3; then 1 each: c (cost 20) before b (10) before the background key (0).
    assert by_key == {"a": 3, "c": 1, "other": 2}
    lag = {dict(labels)["fairness_key"]: v for (n, labels), v in got.items()
           if n == "celery_fair_fleet_service_lag_seconds"}  # fmt: skip
    assert lag == {"a": 15.0 - 30.0, "c": 15.0 - 20.0}  # the mean of 30, 10, 0, 20 is 15
    share = {dict(labels)["fairness_key"]: v for (n, labels), v in got.items()
             if n == "celery_fair_fleet_service_share"}  # fmt: skip
    assert share == pytest.approx({"a": 30 / 60, "c": 20 / 60})  # of 60 in all
    assert got[("celery_fair_fleet_jain_index", ())] == pytest.approx(60**2 / (4 * 1400))
    assert got[("celery_fair_fleet_queue_full_total", (("scope", "key"),))] == 0
    refused = samples({**STATE, "queue_full": {"key": 7, "total": 2}}, top=2)
    assert refused[("celery_fair_fleet_queue_full_total", (("scope", "key"),))] == 7
    assert refused[("celery_fair_fleet_queue_full_total", (("scope", "total"),))] == 2


def test_the_background_key_is_named_and_nothing_running_is_perfectly_fair():
    got = samples(STATE, top=10)
    assert ("celery_fair_fleet_running_jobs_by_key", (("fairness_key", "(background)"),)) in got
    empty = {**STATE, "jobs": [], "costs": {}, "workers": [], "tiers": {}, "types": {}}
    assert samples(empty, top=10)[("celery_fair_fleet_jain_index", ())] == 1.0


def test_every_tier_has_its_cap_in_force_not_only_the_overridden_ones():
    # Tier 8 is overridden to 6 and tier 2 to none; tier 4 (a declared type's, idle) and tier 3
    # (running, no override) are capped at their priority value, as the store caps them.
    got = samples({**STATE, "tiers": {**STATE["tiers"], "3": 1}}, top=10)
    caps = {dict(labels)["tier"]: v for (n, labels), v in got.items()
            if n == "celery_fair_fleet_tier_cap"}  # fmt: skip
    assert caps == {"8": 6, "4": 4, "3": 3}


@pytest.mark.parametrize(
    ("values", "index"),
    [([], 1.0), ([0.0, 0.0], 1.0), ([5.0, 5.0, 5.0], 1.0), ([9.0, 0, 0], 1 / 3)],
)
def test_jains_index(values, index):
    assert jain_index(values) == pytest.approx(index)


def test_with_two_level_keys_the_fleet_metrics_name_the_top_tenants_and_the_rest_as_other():
    tenants = {"acme": {"running": 4, "cost": 9.0}, "beta": {"running": 1, "cost": 2.0},
               "gamma": {"running": 2, "cost": 5.0}}  # fmt: skip
    got = samples({**STATE, "tenants": tenants}, top=1)
    running = {dict(labels)["tenant"]: v for (n, labels), v in got.items()
               if n == "celery_fair_fleet_running_jobs_by_tenant"}  # fmt: skip
    assert running == {"acme": 4, "other": 3}
    cost = {dict(labels)["tenant"]: v for (n, labels), v in got.items()
            if n == "celery_fair_fleet_tenant_accumulated_cost"}  # fmt: skip
    assert cost == {"acme": 9.0, "other": 2.0}
    flat = samples(STATE, top=1)  # flat keys: no tenant series at all
    assert not [n for n, _ in flat if "tenant" in n]


def test_a_tenant_is_a_field_of_task_events_with_two_level_keys():
    from celery_fair.worker.events import on_receipt

    parsed = SimpleNamespace(fairness_key="acme/alice", job_type="clone", job_id="x",
                             submitted=None)  # fmt: skip
    assert on_receipt(parsed, None, 1, 1, "acme")["tenant"] == "acme"
    assert "tenant" not in on_receipt(parsed, None, 1, 1)
    assert helper.COLUMNS["tenant"] == "Tenant"


def test_a_held_jobs_received_event_names_its_tenant_with_two_level_keys():
    from celery_fair.worker.events import received_fields

    message = SimpleNamespace(headers={"fairness_key": "acme/alice", "job_type": "clone"})
    assert received_fields(message, 1, "/")["tenant"] == "acme"
    assert "tenant" not in received_fields(message, 1)
