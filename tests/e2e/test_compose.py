"""docker-compose.yml, checked without Docker (this machine has no engine): its structure, and
every command it runs, started here against the local RabbitMQ and Redis with the same
environment, the service names standing for 127.0.0.1.

The fleet must come up as it would in Docker: two fair workers on one shared store, the
producer's bursty load running through them, Flower with the helper serving the fleet's
fairness, and each worker's own metrics.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest
import redis
import yaml
from celery import Celery
from harness import wait_until

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # examples.git_server, as the image's working directory has it
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
OURS = ("worker-1", "worker-2", "producer", "flower")  # built from the project's image
STORE_DB, BACKEND_DB = 7, 8  # Redis databases no other test uses


def test_the_stack_has_every_part_and_prometheus_scrapes_what_the_workers_serve():
    assert set(SERVICES) == {"redis", "rabbitmq", *OURS, "prometheus"}
    for name in OURS:
        assert SERVICES[name]["build"]["dockerfile"] == "docker/Dockerfile"
    dockerfile = (ROOT / "docker/Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    prometheus = yaml.safe_load((ROOT / "docker/prometheus.yml").read_text())
    targets = {
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    }
    ports = {f"{w}:{SERVICES[w]['environment']['GIT_SERVER_METRICS_PORT']}" for w in OURS[:2]}
    assert targets == ports | {f"flower:{SERVICES['flower']['environment']['FLOWER_PORT']}"}
    mount = SERVICES["prometheus"]["volumes"][0].split(":")[0]
    assert (ROOT / mount).resolve() == ROOT / "docker/prometheus.yml"
    flowerconf = SERVICES["flower"]["command"][-1].split("=", 1)[1]
    assert (ROOT / flowerconf).read_text().count("from celery_fair.flower import *") == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def local(value: str) -> str:
    """A compose URL with its service names for this machine, on this test's databases."""
    value = value.replace("@rabbitmq:", "@127.0.0.1:").replace("//redis:", "//127.0.0.1:")
    return value.replace(":6379/0", f":6379/{STORE_DB}").replace(":6379/1", f":6379/{BACKEND_DB}")


@pytest.fixture
def stack(tmp_path):
    """``start(service, **env)``: that service's command, here; stopped by PID at the end."""
    queue = f"compose-{uuid.uuid4().hex[:8]}"
    procs: list[subprocess.Popen[bytes]] = []

    def start(service: str, **extra: str) -> subprocess.Popen[bytes]:
        spec = SERVICES[service]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.update({k: local(str(v)) for k, v in spec["environment"].items()})
        env.update(GIT_SERVER_QUEUE=queue, **extra)
        command = list(spec["command"])
        command[:1] = (
            [sys.executable, "-m", "celery"] if command[0] == "celery" else [sys.executable]
        )
        with open(tmp_path / f"{service}.log", "ab") as log:
            proc = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        procs.append(proc)
        return proc

    start.queue = queue  # type: ignore[attr-defined]
    yield start
    for proc in reversed(procs):
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    from examples.git_server.app import app

    broker = local(SERVICES["worker-1"]["environment"]["GIT_SERVER_BROKER"])
    with app.connection_for_write(broker) as conn:
        channel = conn.default_channel
        for name in (queue, *(f"{queue}.fair.{i}" for i in range(8))):
            channel.queue_delete(name)
    for db in (STORE_DB, BACKEND_DB):
        redis.Redis(db=db).flushdb()


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def test_every_command_of_the_stack_starts_and_the_fleet_runs_the_load(stack, tmp_path):
    broker = local(SERVICES["worker-1"]["environment"]["GIT_SERVER_BROKER"])
    control = Celery("compose-test", broker=broker, set_as_current=False).control
    host = socket.gethostname()
    # Given the two workers (their metrics on ports the OS picks: here they share one host),
    for name in ("worker-1", "worker-2"):
        stack(name, GIT_SERVER_METRICS_PORT="0")

    def both_up():
        replies = control.ping(destination=[f"worker-1@{host}", f"worker-2@{host}"], timeout=1)
        return len(replies or []) == 2

    wait_until(both_up, 60, "both workers", show=lambda: (tmp_path / "worker-1.log").read_text())
    # Flower with the helper,
    flower_port = free_port()
    flower = stack("flower", FLOWER_PORT=str(flower_port))
    url = f"http://127.0.0.1:{flower_port}"

    def flower_up():
        assert flower.poll() is None, (tmp_path / "flower.log").read_text()
        try:
            return get(f"{url}/healthcheck") == "OK"
        except OSError:
            return False

    wait_until(flower_up, 60, "Flower")
    # and the producer's load (an agent's burst of 200, then three people's clones a second),
    stack("producer")  # the compose command, as is: it runs until stopped

    # then people's clones and the agents' bursts run on both workers,
    def admitted():
        stats = control.inspect(timeout=1).stats() or {}
        pools = [stats.get(f"worker-{i}@{host}", {}).get("pool", {}) for i in (1, 2)]
        return pools if all(p.get("fair-admitted", 0) > 0 for p in pools) else None

    pools = wait_until(admitted, 60, "both workers to run jobs")
    assert all(p["fair-store-mode"] == "shared" for p in pools)  # one scheduler: the store
    # each worker serves its metrics,
    for pool in pools:
        metrics = get(f"http://127.0.0.1:{pool['fair-metrics-port']}/metrics")
        assert 'celery_fair_started_total{job_type="sync-clone",tier="8"}' in metrics
    # Flower shows the jobs' fairness keys: a person's clone succeeded while the agent's burst,
    # published before it, still drains (the fair order, seen through Flower).
    people = {"alice", "bob", "carol", "dave", "erin"}

    def a_person_done_before_the_burst():
        tasks = json.loads(get(f"{url}/api/tasks")).values()
        done = [t for t in tasks if t.get("fairness_key") in people and t["state"] == "SUCCESS"]
        agents = [t for t in tasks if str(t.get("fairness_key")).startswith("agent-")]
        return done and any(t["state"] != "SUCCESS" for t in agents)

    wait_until(a_person_done_before_the_burst, 30, "a person's clone to pass the burst")
    fleet = get(f"{url}/metrics")
    assert "celery_fair_fleet_store_up 1.0" in fleet
    assert "celery_fair_fleet_workers 2.0" in fleet
    control.app.close()
