"""A real Redis Sentinel group for the store tests: a master, a replica and one Sentinel.

Started on spare ports (the ones redis_cluster.py picks from), each server in its own
session, stopped by PID. A group that does not come up fails the tests that need it, never a
skip. One Sentinel with a quorum of 1 is enough to fail over when the master dies; the timings
are short so that a test sees it within seconds.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import redis
from harness import wait_until

from redis_cluster import HOST, answers_ping, spare_ports, stop

MASTER_NAME = "fair-master"
DOWN_AFTER_MS = 1000


@dataclass
class SentinelGroup:
    """The running servers: ``ports`` are master, replica and Sentinel, as started."""

    ports: list[int]
    procs: list[subprocess.Popen[bytes]]
    workdir: Path
    sentinel_password: str | None = None

    @property
    def sentinel_port(self) -> int:
        return self.ports[2]

    def url(self, db: int = 0) -> str:
        """The store URL a user writes for this group."""
        return f"sentinel://{HOST}:{self.sentinel_port}/{db}?master_name={MASTER_NAME}"

    def master_port(self) -> int:
        """The master's port, as the Sentinel says now."""
        with _sentinel(self.sentinel_port, self.sentinel_password) as sentinel:
            _, port = sentinel.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
        return int(port)

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(host=HOST, port=port, socket_timeout=5)

    def kill(self, port: int) -> None:
        """SIGKILL the server on ``port`` (by its PID)."""
        proc = self.procs[self.ports.index(port)]
        proc.kill()
        proc.wait(10)


def _server(workdir: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    with open(workdir / f"{name}.log", "wb") as log:
        return subprocess.Popen(
            ["redis-server", *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )


def _sentinel(port: int, password: str | None) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, password=password, socket_timeout=5)


def _start(
    workdir: Path, procs: list[subprocess.Popen[bytes]], sentinel_password: str | None
) -> list[int]:
    master, replica, sentinel = ports = spare_ports(3)
    common = ["--bind", HOST, "--save", "", "--appendonly", "no", "--dir", str(workdir),
              "--repl-diskless-sync-delay", "0"]  # fmt: skip
    procs.append(_server(workdir, "master", ["--port", str(master), *common]))
    procs.append(
        _server(workdir, "replica", ["--port", str(replica), *common,
                                     "--replicaof", HOST, str(master)])
    )  # fmt: skip
    for port, proc in zip(ports[:2], procs, strict=True):
        wait_until(partial(answers_ping, proc, port, workdir), 15, f"redis-server :{port}")

    def replica_synced() -> bool:
        with redis.Redis(host=HOST, port=replica, socket_timeout=5) as node:
            return node.info("replication").get("master_link_status") == "up"

    # The replica first: a Sentinel finds replicas in the master's INFO, which it reads at
    # once and then every 10 s.
    wait_until(replica_synced, 30, "the replica to sync", every=0.1)
    config = workdir / "sentinel.conf"  # Sentinel rewrites its file: one of its own
    config.write_text(
        f"port {sentinel}\nbind {HOST}\ndir {workdir}\n"
        f"sentinel monitor {MASTER_NAME} {HOST} {master} 1\n"
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n"
        f"sentinel failover-timeout {MASTER_NAME} 5000\n"
        + (f"requirepass {sentinel_password}\n" if sentinel_password else "")
    )
    procs.append(_server(workdir, "sentinel", [str(config), "--sentinel"]))

    def sentinel_sees_replica() -> bool:
        if procs[2].poll() is not None:
            raise AssertionError(f"the Sentinel exited with {procs[2].returncode}")
        try:
            with _sentinel(sentinel, sentinel_password) as node:
                return bool(node.execute_command("SENTINEL REPLICAS", MASTER_NAME))
        except redis.ConnectionError:
            return False

    wait_until(sentinel_sees_replica, 30, "the Sentinel to find the replica", every=0.1)
    return ports


@contextlib.contextmanager
def running_sentinel(
    tmp_path_factory: pytest.TempPathFactory, sentinel_password: str | None = None
) -> Iterator[SentinelGroup]:
    """A master, its replica and a Sentinel (which asks for ``sentinel_password``, if given)
    while the block runs."""
    procs: list[subprocess.Popen[bytes]] = []
    workdir = tmp_path_factory.mktemp("redis-sentinel")
    try:
        try:
            ports = _start(workdir, procs, sentinel_password)
        except (AssertionError, OSError) as exc:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}"
                for p in sorted(workdir.glob("*.log"))
            )
            pytest.fail(f"the Redis Sentinel group did not start: {exc}\n{logs}")
        yield SentinelGroup(ports, procs, workdir, sentinel_password)
    finally:
        stop(procs)
