"""Looking at a fleet's store: ``RedisStore.inspect()`` and ``celery-fair store``.

On the three Redis deployments (one server, a cluster, behind Sentinel); the in-memory store
lives inside its worker and has nothing to show from outside.
"""

from __future__ import annotations

import json
import uuid

import pytest
from shared_redis import REDIS_URL, clean
from test_contract import NEVER, ask, tenant_ask

from celery_fair.cli import main
from celery_fair.store import Done
from celery_fair.store.base import SCHEMA


@pytest.fixture(params=["redis", "cluster", "sentinel"])
def kind(request):
    return request.param


def keys_of(store) -> list:
    """The prefix's keys, wherever they live (one slot: one node)."""
    return list(store.client.scan_iter(match=f"{{{store.prefix}}}:*"))


def test_an_unused_prefix_shows_empty_and_looking_creates_nothing(make_store):
    store = make_store(lifecycle=NEVER)
    state = store.inspect()
    assert state["schema"] is None
    assert (state["workers"], state["jobs"], state["conflicts"]) == ([], [], {})
    assert state["lanes"] == {"size": 0, "keys": {}}
    assert keys_of(store) == []


def test_inspect_shows_workers_jobs_counts_conflicts_and_costs(make_store):
    store = make_store(lifecycle=NEVER, lease=30)
    a, b = store.admit(
        "w1", [ask("a", "alice", job_id="linux"), ask("b", "bob", type="pull", priority=4)]
    ).grants
    [c] = store.admit("w2", [ask("c", "carol", job_id="git", cost=4.0)]).grants
    store.finish("w1", [Done("b", b.token, 0.5, final=True)])

    state = store.inspect()

    assert state["schema"] == SCHEMA
    assert state["token"] == c.token
    workers = {w["worker"]: w for w in state["workers"]}
    assert {w: workers[w]["jobs"] for w in workers} == {"w1": 1, "w2": 1}
    assert all(0 < w["lease_until"] - state["now"] <= 30 for w in workers.values())
    jobs = {j["uid"]: j for j in state["jobs"]}
    assert set(jobs) == {"a", "c"}
    assert jobs["a"]["worker"] == "w1"
    assert jobs["a"]["token"] == a.token
    assert jobs["a"]["fairness_key"] == "alice"
    assert jobs["c"]["estimate"] == 4.0
    assert state["conflicts"] == {"3:gitlinux": "a", "3:gitgit": "c"}
    assert state["tiers"] == {"8": 2}
    assert state["types"] == {"clone": 2}
    assert state["costs"] == {"alice": 1.0, "carol": 4.0}  # the keys that run
    assert state["keys"] == 3  # bob's cost is kept too
    assert state["tombstones"] == 1
    # Looking changed nothing: the next admission sees the same fleet.
    assert store.inspect()["jobs"] == state["jobs"]


def test_inspect_counts_the_submits_a_limit_refused_by_scope(make_store):
    store = make_store(lifecycle=NEVER)
    assert store.inspect()["queue_full"] == {}
    assert store.track("alice", "a0", key_limit=1).added
    for i in range(2):  # alice's limit refuses twice, the total once
        assert store.track("alice", f"a{i + 1}", key_limit=1).refused_by == "key"
    assert store.track("bob", "b0", total_limit=1).refused_by == "total"
    assert store.track("bob", "b1", total_limit=2).added
    assert store.inspect()["queue_full"] == {"key": 2, "total": 1}


def test_celery_fair_store_prints_the_state_as_json_and_as_a_table(redis_client, capsys):
    from celery_fair.store import RedisStore

    prefix = f"test-cli-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis_client, prefix)
    try:
        store.admit("w1", [ask("a", "alice", job_id="linux")])
        store.sweep_lanes("w1", 4, range(4), set())  # w1 consumes 4 lanes: lanes are given
        assert store.ask_lane("bob") == 0
        assert main(["store", REDIS_URL, "--prefix", prefix, "--format", "json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert [j["uid"] for j in shown["jobs"]] == ["a"]
        assert shown["lanes"] == {"size": 4, "keys": {"bob": 0}}
        assert main(["store", REDIS_URL, "--prefix", prefix]) == 0
        table = capsys.readouterr().out
        assert "workers (1):" in table
        assert "a  clone (tier 8)  key alice  on w1" in table
        assert "holds git/linux" in table
        assert "conflicts held: git/linux by a" in table
        assert "lanes: 4 agreed; keys in a lane: bob 0" in table
    finally:
        clean(redis_client, prefix)


def test_celery_fair_store_says_so_when_redis_cannot_be_reached_or_the_url_is_wrong(capsys):
    assert main(["store", "redis://127.0.0.1:1/0"]) == 1
    assert "unreachable" in capsys.readouterr().err
    assert main(["store", "sentinel://127.0.0.1:1/0"]) == 2
    assert "needs the master's name" in capsys.readouterr().err


def test_inspect_shows_each_running_tenant_with_its_jobs_and_cost(make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [tenant_ask("a", "acme/x", cost=2.0), tenant_ask("b", "acme/y", cost=1.0)])
    store.admit("w2", [tenant_ask("c", "beta/x", cost=4.0, tenant_weight=2.0)])
    state = store.inspect()
    assert state["tenants"] == {
        "acme": {"running": 2, "cost": 3.0},
        "beta": {"running": 1, "cost": 2.0},
    }
    assert {j["uid"]: j.get("tenant") for j in state["jobs"]} == {"a": "acme", "b": "acme",
                                                                   "c": "beta"}  # fmt: skip
    store.admit("w1", [ask("d", "flat")])
    assert "tenant" not in next(j for j in store.inspect()["jobs"] if j["uid"] == "d")
