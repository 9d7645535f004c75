"""A redis-server of a test's own on a spare port: for a test that kills or restarts its Redis,
or measures its memory, without touching the machine's shared one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess

import pytest
import redis
from harness import wait_until


class PrivateRedis:
    """A redis-server of the test's own on a spare port, stopped by its PID."""

    def __init__(self, directory):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.directory = directory
        self.proc = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        client = redis.Redis.from_url(self.url)
        wait_until(lambda: _pings(client), 10, f"redis-server on port {self.port}")
        client.close()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _pings(client):
    try:
        return client.ping()
    except redis.ConnectionError:
        return False


@pytest.fixture
def private_redis(tmp_path):
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()
