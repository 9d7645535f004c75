"""A real Redis Cluster of three masters for the store tests, started on spare ports.

Used by the ``cluster`` fixture (tests/store/conftest.py), session-wide, so the whole contract
suite and the engine tests run on it beside the in-memory store and the single Redis. A
cluster that does not come up fails the tests that need it (never a skip). The servers are
stopped by PID (SIGTERM, then SIGKILL), never by name.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import redis
from harness import wait_until
from redis.cluster import RedisCluster

HOST = "127.0.0.1"
MASTERS = 3
SLOTS = 16384
BUS_OFFSET = 10000  # a cluster node also listens on its port + 10000, the cluster bus
# Nodes on 20000-21999, buses on 30000-31999: both below Linux's ephemeral range (32768 up),
# so no outgoing connection takes one of them while the cluster starts.
PORTS = range(20000, 22000)
ATTEMPTS = 3  # port sets tried, in case another process takes a port between check and bind


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
