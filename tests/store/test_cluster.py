"""What only a Redis Cluster shows: where the keys live, every master, a master down.

The whole contract suite (test_contract.py) and the engine tests run on the cluster too (the
``kind`` fixture's ``cluster``); this module covers what is particular to it. The cluster is
the session's own, started on spare ports (tests/redis_cluster.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from harness import wait_until
from test_contract import ask

from celery_fair.core import CostLifecycle
from celery_fair.errors import StoreUnavailable
from celery_fair.store import Done, RedisStore, Running, Verdict, conflict_field, estimate_field
from celery_fair.store.wire import TOKEN_LOW_BITS
from redis_cluster import HOST, MASTERS, Cluster, cluster_states, running_cluster, stop

NEVER = CostLifecycle.never()
# The keys of docs/store.md ("Keys"), all of which test_every_key_of_a_prefix_... creates.
DOCUMENTED_KEYS = (
    "meta", "tiers", "types", "conflicts", "jobs", "workers",
    "acc", "seen", "active", "est", "estseen", "minacc", "done", "lanes",
)  # fmt: skip


class Stores:
    """``make_store(prefix=None, **options)``: a store on its own ``RedisCluster`` client, as
    each worker has its own connection; by default on this test's fresh ``prefix``."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.prefix = f"test-{uuid.uuid4().hex[:12]}"
        self.made: list[RedisStore] = []

    def __call__(self, prefix: str | None = None, **options) -> RedisStore:
        store = RedisStore(self.cluster.client(), prefix or self.prefix, **options)
        self.made.append(store)
        return store


@pytest.fixture
def on_cluster(cluster: Cluster) -> Iterator[Stores]:
    stores = Stores(cluster)
    yield stores
    for store in stores.made:
        store.close()


def verdicts(reply) -> list[Verdict]:
    return [g.verdict for g in reply.grants]


def keys_by_node(cluster: Cluster, prefix: str) -> dict[int, set[str]]:
    """Every key of ``prefix`` on every master, found by SCAN on each node."""
    found = {}
    for port in cluster.ports:
        with cluster.node(port) as node:
            assert node.execute_command("ROLE")[0] == b"master"
            keys = {k.decode() for k in node.scan_iter(match=f"{{{prefix}}}:*", count=1000)}
        if keys:
            found[port] = keys
    return found


# -- the contract on the cluster --------------------------------------------------------------


def test_the_cluster_has_three_masters_that_serve_every_slot(cluster):
    states = cluster_states(cluster.ports)
    assert {s["cluster_state"] for s in states.values()} == {"ok"}
    assert {s["cluster_size"] for s in states.values()} == {str(MASTERS)}
    with cluster.node(cluster.ports[0]) as node:
        owners = {int(master[1]) for _, _, master, *_ in node.execute_command("CLUSTER SLOTS")}
    assert owners == set(cluster.ports)


def test_scripts_are_loaded_again_after_script_flush_on_every_master(cluster, on_cluster):
    store = on_cluster(lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    for port in cluster.ports:
        with cluster.node(port) as node:
            node.script_flush()
    assert verdicts(store.admit("w1", [ask("b")])) == [Verdict.ADMITTED]


# -- where the keys live ----------------------------------------------------------------------


def test_every_key_of_a_prefix_lives_in_one_slot_on_one_master(cluster, on_cluster):
    # Given every operation, with a lifecycle that uses every key (TTLs, advance_idle),
    life = CostLifecycle(cost_ttl=3600, estimate_ttl=3600, advance_idle=True)
    store = on_cluster(lifecycle=life)
    [a, _b] = store.admit("w1", [ask("a", "gone", job_id="x"), ask("b", "busy", job_id="y")]).grants
    store.finish("w1", [Done("a", a.token, 2.0, final=True)])  # "gone" idle now, b runs on
    store.admit("w1", [ask("c", "busy", job_id="x")])  # a learned estimate is used
    store.heartbeat("w1", [conflict_field("git", "y")], ["busy"])
    store.register("w1", [Running("z", 99, "pull", 4, "", estimate_field("pull", None),
                                  "carol", 1.0, 1.0)])  # fmt: skip
    store.sweep_lanes("w1", 2, [0, 1], [1])  # the lane table (lanes.lua)
    assert store.ask_lane("busy") == 0
    store.renew_lanes(["busy"])
    assert store.lanes(-1).lanes == {"busy": 0}
    # when every master is scanned for the prefix's keys,
    found = keys_by_node(cluster, on_cluster.prefix)
    # then they are all on one master, all in one slot, and that master serves that slot.
    assert len(found) == 1, f"keys spread over several masters: {found}"
    [(port, keys)] = found.items()
    assert {f"{{{on_cluster.prefix}}}:{name}" for name in DOCUMENTED_KEYS} <= keys
    with cluster.node(port) as node:
        slots = {key: node.execute_command("CLUSTER KEYSLOT", key) for key in sorted(keys)}
        tag_slot = node.execute_command("CLUSTER KEYSLOT", on_cluster.prefix)
    assert set(slots.values()) == {tag_slot}, slots
    assert cluster.owner(tag_slot) == port


def test_two_prefixes_on_different_masters_are_independent(cluster, on_cluster):
    # Find a second prefix whose slot another master serves (random names: a few tries).
    first = on_cluster.prefix
    with cluster.node(cluster.ports[0]) as node:
        home = cluster.owner(node.execute_command("CLUSTER KEYSLOT", first))
        for _ in range(100):
            second = f"test-{uuid.uuid4().hex[:12]}"
            if cluster.owner(node.execute_command("CLUSTER KEYSLOT", second)) != home:
                break
        else:
            raise AssertionError("no prefix found on another master in 100 tries")
    one, two = on_cluster(first, lifecycle=NEVER), on_cluster(second, lifecycle=NEVER)
    # The same job type, conflict and key under a cap of 1 is admitted once in each scheduler.
    for store in (one, two):
        [grant] = store.admit("w1", [ask("a", "alice", job_id="linux", type_cap=1)]).grants
        assert (grant.verdict, grant.accumulated) == (Verdict.ADMITTED, 1.0)
        assert grant.token % (1 << TOKEN_LOW_BITS) == 1  # its scheduler's first
        assert verdicts(store.admit("w1", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]
        assert store.finish("w1", [Done("a", grant.token, 4.0)])[0].applied
    learned = 0.3 * 4.0 + (1 - 0.3) * 1.0
    assert one.estimate("clone", "linux", 1.0) == two.estimate("clone", "linux", 1.0) == learned
    # Each prefix's keys are on its own master.
    assert set(keys_by_node(cluster, first)) == {home}
    [other] = keys_by_node(cluster, second)
    assert other != home


# -- a master down ----------------------------------------------------------------------------


@dataclass
class Outage:
    """A cluster that has lost the master of ``lost`` and says so (``cluster_state:fail``);
    ``kept``'s master still runs."""

    lost: RedisStore
    kept: RedisStore


def prefix_on(cluster: Cluster, wanted: bool, port: int) -> str:
    """A fresh prefix whose slot ``port`` serves (``wanted``) or does not."""
    with cluster.node(port) as node:
        for _ in range(200):
            prefix = f"test-{uuid.uuid4().hex[:12]}"
            slot = node.execute_command("CLUSTER KEYSLOT", prefix)
            if (cluster.owner(slot) == port) == wanted:
                return prefix
    raise AssertionError(f"no prefix found for port {port} in 200 tries")


@pytest.fixture(scope="module")
def outage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    with running_cluster(tmp_path_factory) as cluster:
        victim, *alive = cluster.ports
        for port in cluster.ports:  # notice a dead node within 0.5 s, not the default 15 s
            with cluster.node(port) as node:
                node.config_set("cluster-node-timeout", 500)
        lost = RedisStore(cluster.client(), prefix_on(cluster, True, victim), lifecycle=NEVER)
        kept = RedisStore(cluster.client(), prefix_on(cluster, False, victim), lifecycle=NEVER)
        for store in (lost, kept):
            assert verdicts(store.admit("w1", [ask("a")])) == [Verdict.ADMITTED]
        stop([cluster.procs[0]])

        def failed() -> bool:
            states = cluster_states(alive)
            return all(s["cluster_state"] == "fail" for s in states.values())

        wait_until(failed, 15, f"the masters {alive} to mark the cluster failed")
        yield Outage(lost, kept)
        lost.close()
        kept.close()


def test_a_prefix_whose_master_is_down_raises_store_unavailable(outage):
    with pytest.raises(StoreUnavailable):
        outage.lost.admit("w1", [ask("b")])
    with pytest.raises(StoreUnavailable):
        outage.lost.accumulated_cost("k")


def test_admit_on_a_live_master_of_a_failed_cluster_raises_store_unavailable(outage):
    with pytest.raises(StoreUnavailable):
        outage.kept.admit("w1", [ask("b")])


def test_a_read_on_a_live_master_of_a_failed_cluster_raises_store_unavailable(outage):
    with pytest.raises(StoreUnavailable):
        outage.kept.accumulated_cost("k")


def test_fair_store_url_names_the_cluster_as_redis_plus_cluster(cluster):
    # What a worker builds from fair_store_url = "redis+cluster://host:port" (any node will do).
    prefix = f"test-url-{uuid.uuid4().hex[:8]}"
    store = RedisStore.from_url(f"redis+cluster://{HOST}:{cluster.ports[1]}", prefix=prefix)
    try:
        assert type(store.client).__name__ == "RedisCluster"
        reply = store.admit("w1", [ask("a", type_cap=1), ask("b", type_cap=1)])
        assert verdicts(reply) == [Verdict.ADMITTED, Verdict.TYPE_CAP]
    finally:
        store.close()
