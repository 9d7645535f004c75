"""The Redis store on a real Redis Cluster of three masters, which this module starts itself on
spare ports: the scripts run unchanged through ``RedisCluster``, every key of one prefix lives
in one hash slot, and prefixes on different masters are independent schedulers.

A cluster that does not come up fails every test here (never a skip). The servers are stopped by
PID at the end of the module (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import redis
from harness import wait_until
from redis.cluster import RedisCluster
from test_contract import ask

from celery_fair.core import CostLifecycle
from celery_fair.errors import StoreUnavailable
from celery_fair.store import Done, RedisStore, Running, Verdict, conflict_field, estimate_field

HOST = "127.0.0.1"
MASTERS = 3
SLOTS = 16384
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000, the cluster bus
# Nodes on 20000-21999, buses on 30000-31999: both below Linux's ephemeral range (32768 up),
# so no outgoing connection takes one of them while the cluster starts.
PORTS = range(20000, 22000)
ATTEMPTS = 3  # port sets tried, in case another process takes a port between check and bind
NEVER = CostLifecycle.never()
# The 13 keys of docs/store.md ("Keys"), all of which test_every_key_of_a_prefix_... creates.
DOCUMENTED_KEYS = (
    "meta", "tiers", "types", "conflicts", "jobs", "byworker", "workers",
    "acc", "seen", "active", "est", "estseen", "minacc",
)  # fmt: skip


# -- the cluster ------------------------------------------------------------------------------


@dataclass
class Cluster:
    """Three running masters, their ports and their processes."""

    ports: list[int]
    procs: list[subprocess.Popen[bytes]]
    workdir: Path

    def node(self, port: int) -> redis.Redis:
        """A plain connection to one node (for commands about that node only)."""
        return redis.Redis(host=HOST, port=port, socket_timeout=5)

    def client(self) -> RedisCluster:
        return RedisCluster(host=HOST, port=self.ports[0], socket_timeout=5)

    def owner(self, slot: int) -> int:
        """The port of the master that serves ``slot``, as the cluster itself says."""
        with self.node(self.ports[0]) as node:
            for start, end, master, *_ in node.execute_command("CLUSTER SLOTS"):
                if start <= slot <= end:
                    return int(master[1])
        raise AssertionError(f"no master serves slot {slot}")


def is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def spare_ports(n: int) -> list[int]:
    candidates = (
        p for p in random.sample(PORTS, len(PORTS)) if is_free(p) and is_free(p + BUS_OFFSET)
    )
    ports = list(itertools.islice(candidates, n))
    assert len(ports) == n, f"fewer than {n} free ports (and bus ports) in {PORTS}"
    return ports


def start_node(port: int, workdir: Path) -> subprocess.Popen[bytes]:
    command = [
        "redis-server", "--port", str(port),
        "--cluster-enabled", "yes",
        "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
        "--dir", str(workdir), "--save", "", "--appendonly", "no",
        "--bind", HOST, "--daemonize", "no",
    ]  # fmt: skip
    with open(workdir / f"node-{port}.log", "wb") as log:
        # Its own session: a Ctrl-C of pytest does not reach it; the fixture stops it by PID.
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def log_tail(workdir: Path, port: int) -> str:
    path = workdir / f"node-{port}.log"
    return path.read_text(errors="replace")[-2000:] if path.exists() else "(no log)"


def answers_ping(proc: subprocess.Popen[bytes], port: int, workdir: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(
            f"redis-server on port {port} exited with {proc.returncode}:\n{log_tail(workdir, port)}"
        )
    try:
        with redis.Redis(host=HOST, port=port, socket_timeout=1, socket_connect_timeout=1) as c:
            return bool(c.ping())
    except redis.ConnectionError:
        return False


def cluster_states(ports: list[int]) -> dict[int, dict[str, str]]:
    """CLUSTER INFO of every node, as ``{port: {field: value}}``."""
    states = {}
    for port in ports:
        with redis.Redis(host=HOST, port=port, socket_timeout=5) as node:
            text = node.execute_command("CLUSTER INFO")
        if isinstance(text, bytes):
            text = text.decode()
        if isinstance(text, dict):  # some redis-py versions parse it already
            states[port] = {k: str(v) for k, v in text.items()}
        else:
            states[port] = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return states


def is_formed(ports: list[int]) -> dict[int, dict[str, str]] | None:
    """Every node says the cluster is ok, knows all masters and sees every slot served."""
    states = cluster_states(ports)
    formed = all(
        s.get("cluster_state") == "ok"
        and s.get("cluster_known_nodes") == str(len(ports))
        and s.get("cluster_slots_ok") == str(SLOTS)
        for s in states.values()
    )
    return states if formed else None


def form_cluster(workdir: Path, procs: list[subprocess.Popen[bytes]]) -> list[int]:
    """Start three masters on spare ports and join them; append each process to ``procs``."""
    ports = spare_ports(MASTERS)
    started = [start_node(port, workdir) for port in ports]
    procs += started
    for port, proc in zip(ports, started, strict=True):
        wait_until(
            partial(answers_ping, proc, port, workdir), 15, f"redis-server :{port} to answer"
        )
    command = ["redis-cli", "--cluster", "create", *(f"{HOST}:{p}" for p in ports),
               "--cluster-replicas", "0", "--cluster-yes"]  # fmt: skip
    create = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert create.returncode == 0, f"redis-cli --cluster create failed:\n{create.stdout}"
    wait_until(lambda: is_formed(ports), 30, f"cluster_state:ok on {ports}", every=0.1)
    return ports


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextlib.contextmanager
def running_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A formed cluster while the block runs; a cluster that does not form fails the test."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        failures = []
        for attempt in range(ATTEMPTS):
            workdir = tmp_path_factory.mktemp("redis-cluster")
            try:
                ports = form_cluster(workdir, procs)
                break
            except (AssertionError, OSError, subprocess.TimeoutExpired) as exc:
                failures.append(f"attempt {attempt + 1}: {exc}")
                stop(procs)
                procs.clear()
        else:
            pytest.fail("the Redis Cluster did not start:\n" + "\n".join(failures))
        yield Cluster(ports, procs, workdir)
    finally:
        stop(procs)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory) as formed:
        yield formed


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
def make_store(cluster: Cluster) -> Iterator[Stores]:
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


def test_tier_cap_and_type_cap_count_every_worker_on_the_cluster(make_store):
    one, two = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    reply = one.admit(
        "w1",
        [
            ask("a", tier_cap=2),
            ask("b", tier_cap=2),
            ask("c", tier_cap=2),  # the tier is full
            ask("d", type="pull", priority=4, tier_cap=1),  # another tier still has room
        ],
    )
    assert verdicts(reply) == [
        Verdict.ADMITTED,
        Verdict.ADMITTED,
        Verdict.TIER_CAP,
        Verdict.ADMITTED,
    ]
    assert (reply.tiers, reply.types) == ({8: 2, 4: 1}, {"clone": 2, "pull": 1})
    # Another worker, on its own cluster connection, sees the same counts.
    assert verdicts(two.admit("w2", [ask("e", type="pull", type_cap=1)])) == [Verdict.TYPE_CAP]
    pull = reply.grants[3]
    assert one.finish("w1", [Done("d", pull.token, None)])[0].applied
    assert verdicts(two.admit("w2", [ask("e", type="pull", type_cap=1)])) == [Verdict.ADMITTED]


def test_a_held_conflict_refuses_until_its_job_finishes(make_store):
    store, other = make_store(lifecycle=NEVER), make_store(lifecycle=NEVER)
    [a, b, c] = store.admit(
        "w1", [ask("a", job_id="linux"), ask("b", job_id="linux"), ask("c", job_id="git")]
    ).grants
    assert [a.verdict, b.verdict, c.verdict] == [
        Verdict.ADMITTED,
        Verdict.CONFLICT,
        Verdict.ADMITTED,
    ]
    assert verdicts(other.admit("w2", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]
    [done] = store.finish("w1", [Done("a", a.token, None)])
    assert done.applied
    reply = other.admit("w2", [ask("b", job_id="linux")])
    assert verdicts(reply) == [Verdict.ADMITTED]
    assert reply.types == {"clone": 2}  # a released its count, b and c run


def test_a_stale_token_changes_nothing_on_the_cluster(make_store):
    store = make_store(lifecycle=NEVER)
    [grant] = store.admit("w1", [ask("a", job_id="linux", type_cap=1)]).grants
    [stale] = store.finish("w1", [Done("a", grant.token + 1, 9.0)])
    assert not stale.applied
    assert verdicts(store.admit("w1", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]
    assert store.estimate("clone", "linux", 1.0) == 1.0
    [ok, twice] = store.finish("w1", [Done("a", grant.token, 2.0), Done("a", grant.token, 2.0)])
    assert (ok.applied, twice.applied) == (True, False)
    assert store.estimate("clone", "linux", 1.0) == 0.3 * 2.0 + (1 - 0.3) * 1.0


def test_estimates_are_learned_bit_for_bit_and_charged_on_the_cluster(make_store):
    store = make_store(alpha=0.3, lifecycle=NEVER)
    expected = 1.0
    charged = 0.0
    for i, elapsed in enumerate([5.0, 0.1, 7.3, 1e-9, 123.456]):
        [grant] = store.admit("w1", [ask(f"j{i}", "alice", job_id="linux")]).grants
        charged += expected
        assert (grant.estimate, grant.accumulated) == (expected, charged)
        [done] = store.finish("w1", [Done(f"j{i}", grant.token, elapsed)])
        expected = 0.3 * elapsed + (1 - 0.3) * expected
        assert done.estimate == expected  # bit for bit, not approximately
    assert store.estimate("clone", "linux", 1.0) == expected
    assert store.accumulated_cost("alice") == charged


def test_a_dead_workers_jobs_are_reclaimed_after_a_short_lease_on_the_cluster(make_store):
    dead, alive = make_store(lease=0.3, lifecycle=NEVER), make_store(lease=0.3, lifecycle=NEVER)
    linux = conflict_field("git", "linux")
    [grant] = dead.admit("dead", [ask("a", job_id="linux", type_cap=1)]).grants
    assert grant.verdict is Verdict.ADMITTED
    assert verdicts(alive.admit("alive", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]

    def reclaimed():
        view = alive.heartbeat("alive", [linux], [])
        return view if not view.held[linux] else None

    view = wait_until(reclaimed, 10, "the dead worker's 0.3 s lease to expire")
    assert view.types == {}
    [b] = alive.admit("alive", [ask("b", job_id="linux", type_cap=1)]).grants
    assert b.verdict is Verdict.ADMITTED
    # The dead worker's late report changes nothing: b keeps its conflict, nothing is learned.
    [late] = dead.finish("dead", [Done("a", grant.token, 50.0)])
    assert not late.applied
    assert alive.estimate("clone", "linux", 1.0) == 1.0
    assert alive.heartbeat("alive", [linux], []).held[linux]


def test_heartbeat_and_register_on_the_cluster(make_store):
    store = make_store(lifecycle=NEVER)
    [grant] = store.admit("w1", [ask("a", "alice", job_id="linux", cost=3.0)]).grants
    jobs = [
        Running("a", grant.token, "clone", 8, conflict_field("git", "linux"),
                estimate_field("clone", "linux"), "alice", 3.0, 1.0),
        Running("z", 99, "clone", 8, conflict_field("git", "git"),
                estimate_field("clone", "git"), "bob", 1.0, 1.0),
    ]  # fmt: skip
    assert store.register("w1", jobs) == 1  # only z was forgotten
    git = conflict_field("git", "git")
    view = store.heartbeat("w1", [git, conflict_field("git", "redis")], ["alice", "bob"])
    assert (view.mine, view.reclaimed, view.tiers, view.types) == (2, 0, {8: 2}, {"clone": 2})
    assert view.held == {git: True, conflict_field("git", "redis"): False}
    assert view.accumulated == {"alice": 3.0, "bob": 0.0}
    assert store.finish("w1", [Done("z", 99, None)])[0].applied
    assert store.admit("w1", [ask("b")]).grants[0].token > 99


def test_scripts_are_loaded_again_after_script_flush_on_every_master(cluster, make_store):
    store = make_store(lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    for port in cluster.ports:
        with cluster.node(port) as node:
            node.script_flush()
    assert verdicts(store.admit("w1", [ask("b")])) == [Verdict.ADMITTED]


# -- where the keys live ----------------------------------------------------------------------


def test_every_key_of_a_prefix_lives_in_one_slot_on_one_master(cluster, make_store):
    # Given every operation, with a lifecycle that uses every key (TTLs, advance_idle),
    life = CostLifecycle(cost_ttl=3600, estimate_ttl=3600, advance_idle=True)
    store = make_store(lifecycle=life)
    [a, _b] = store.admit("w1", [ask("a", "gone", job_id="x"), ask("b", "busy", job_id="y")]).grants
    store.finish("w1", [Done("a", a.token, 2.0)])  # "gone" is idle now, b still runs
    store.admit("w1", [ask("c", "busy", job_id="x")])  # a learned estimate is used
    store.heartbeat("w1", [conflict_field("git", "y")], ["busy"])
    store.register("w1", [Running("z", 99, "pull", 4, "", estimate_field("pull", None),
                                  "carol", 1.0, 1.0)])  # fmt: skip
    # when every master is scanned for the prefix's keys,
    found = keys_by_node(cluster, make_store.prefix)
    # then they are all on one master, all in one slot, and that master serves that slot.
    assert len(found) == 1, f"keys spread over several masters: {found}"
    [(port, keys)] = found.items()
    assert {f"{{{make_store.prefix}}}:{name}" for name in DOCUMENTED_KEYS} <= keys
    with cluster.node(port) as node:
        slots = {key: node.execute_command("CLUSTER KEYSLOT", key) for key in sorted(keys)}
        tag_slot = node.execute_command("CLUSTER KEYSLOT", make_store.prefix)
    assert set(slots.values()) == {tag_slot}, slots
    assert cluster.owner(tag_slot) == port


def test_two_prefixes_on_different_masters_are_independent(cluster, make_store):
    # Find a second prefix whose slot another master serves (random names: a few tries).
    first = make_store.prefix
    with cluster.node(cluster.ports[0]) as node:
        home = cluster.owner(node.execute_command("CLUSTER KEYSLOT", first))
        for _ in range(100):
            second = f"test-{uuid.uuid4().hex[:12]}"
            if cluster.owner(node.execute_command("CLUSTER KEYSLOT", second)) != home:
                break
        else:
            raise AssertionError("no prefix found on another master in 100 tries")
    one, two = make_store(first, lifecycle=NEVER), make_store(second, lifecycle=NEVER)
    # The same job type, conflict and key under a cap of 1 is admitted once in each scheduler.
    for store in (one, two):
        [grant] = store.admit("w1", [ask("a", "alice", job_id="linux", type_cap=1)]).grants
        assert (grant.verdict, grant.token, grant.accumulated) == (Verdict.ADMITTED, 1, 1.0)
        assert verdicts(store.admit("w1", [ask("b", job_id="linux")])) == [Verdict.CONFLICT]
        assert store.finish("w1", [Done("a", 1, 4.0)])[0].applied
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


def test_a_worker_names_the_cluster_by_url_and_its_engine_decides_through_it(cluster):
    # fair_store_url = "redis+cluster://host:port" in a worker; here the same store, by hand,
    # under two engines (two workers) sharing a conflict.
    from celery_fair.core import JobType, Scheduler, SchedulerConfig, SimClock
    from celery_fair.engine import Engine

    prefix = f"test-url-{uuid.uuid4().hex[:8]}"
    clock = SimClock()
    stores = [
        RedisStore.from_url(f"redis+cluster://{HOST}:{cluster.ports[1]}", prefix=prefix)
        for _ in range(2)
    ]
    clone = JobType("clone", 8, conflict_group="git")
    one, two = (
        Engine(Scheduler(SchedulerConfig(2), clock, [clone]), store, worker=f"w{i}", clock=clock)
        for i, store in enumerate(stores)
    )
    try:
        one.submit("a", "clone", "linux", "k", arrival=0)
        two.submit("b", "clone", "linux", "k", arrival=0)
        assert [a.ref for a in one.run_inline().start] == ["a"]
        assert two.run_inline().start == []  # the conflict is held on the cluster
        one.finish("a", 1.0, final=True)
        one.run_inline()
        clock.advance(1.0)
        assert [a.ref for a in two.run_inline().start] == ["b"]
    finally:
        for store in stores:  # the cluster is this module's own: its keys go with it
            store.close()
