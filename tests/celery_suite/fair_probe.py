"""pytest plugin: Celery's own integration suite against a ``-P fair`` session worker.

Loaded by ``run.py`` (``-p fair_probe``) into a run of Celery's ``t/integration``. With
``CELERY_FAIR_SUITE_POOL=fair`` the suite's session worker, which Celery starts in-process on
its prefork pool, gets the fair pool instead (``fair_pool`` stays prefork), exactly as
``celery worker -P fair`` would. Then, after every test:

- the gate must be installed and must have taken every request the worker received (a run on
  the plain pool by mistake fails every test);
- once Celery itself counts nothing reserved or running, the gate must count nothing inside it
  either (held, reserved, running fair or plain, handed to the pool and not taken). A count
  left behind fails the test that left it, as a teardown error.

With ``CELERY_FAIR_SUITE_POOL=prefork`` (the baseline) nothing changes but the record. Either
way ``CELERY_FAIR_SUITE_REPORT`` names a JSON file that gets what the probe saw: the prefetch
count, the gate's final statistics, the tests it checked and those after which the worker never
became idle.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from celery.contrib.testing import worker as testing_worker
from celery.worker import state as worker_state

POOL = os.environ.get("CELERY_FAIR_SUITE_POOL", "fair")
REPORT = os.environ.get("CELERY_FAIR_SUITE_REPORT")
#: What the gate counts inside it: each is zero when the worker is idle.
INSIDE = ("fair-held", "fair-reserved", "fair-running", "plain-running", "pool-in-line")
#: How long a test's leftovers may keep the worker busy before the check waits for the next.
IDLE_SECONDS = 60.0
#: How long the gate may take to hear of ends Celery has already recorded (pool callbacks).
SETTLE_SECONDS = 5.0

_seen: dict[str, Any] = {"pool": POOL, "checked": 0, "not_idle": [], "leaks": []}
_worker: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    if POOL == "fair":
        _swap_pool()
    testing_worker.test_worker_started.connect(_on_worker_started, weak=False)


def _swap_pool() -> None:
    """Give the session worker the fair pool where Celery's suite asks for prefork."""
    from celery_fair.worker.pool import FairPool

    original = testing_worker._start_worker_thread

    def start(app: Any, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("pool") == "prefork":
            kwargs["pool"] = FairPool
        return original(app, *args, **kwargs)

    testing_worker._start_worker_thread = start


def _on_worker_started(sender: Any = None, worker: Any = None, **_: Any) -> None:
    _worker[:] = [worker]
    qos = getattr(worker.consumer, "qos", None)
    _seen["prefetch_count_at_start"] = getattr(qos, "value", None)
    _seen["pool_class"] = f"{type(worker.pool).__module__}.{type(worker.pool).__qualname__}"


def _gate() -> Any:
    return getattr(_worker[0].consumer, "fair_gate", None) if _worker else None


def _celery_idle() -> bool:
    return not worker_state.reserved_requests and not worker_state.active_requests


def _wait(predicate: Any, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _inside(gate: Any) -> dict[str, int]:
    info = gate.pool_info()
    return {k: info[k] for k in INSIDE if info.get(k)}


@pytest.fixture(autouse=True)
def _fair_gate_probe(request: pytest.FixtureRequest) -> Any:
    yield
    if POOL != "fair" or not _worker:
        return
    gate = _gate()
    if gate is None:
        pytest.fail("celery-fair's gate is not installed in the session worker")
    if not _wait(_celery_idle, IDLE_SECONDS):
        _seen["not_idle"].append(request.node.nodeid)
        return
    _seen["checked"] += 1
    before = _seen.get("left", {})  # what earlier tests left: their failures said so
    if not _wait(lambda: _celery_idle() and _inside(gate) == before, SETTLE_SECONDS):
        left = _inside(gate)
        if left != before and _celery_idle():
            _seen["left"] = left
            _seen["leaks"].append({"test": request.node.nodeid, "inside": left})
            pytest.fail(f"the gate counts {left} while Celery runs and reserves nothing")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    gate = _gate()
    if _worker:
        qos = getattr(_worker[0].consumer, "qos", None)
        _seen["prefetch_count_at_end"] = getattr(qos, "value", None)
    if gate is not None:
        info = _seen["gate"] = gate.pool_info()
        if not info.get("plain-started") and not info.get("fair-admitted"):
            _seen["inactive"] = "the gate took no request"
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    elif POOL == "fair":
        _seen["inactive"] = "the gate was never installed"
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if REPORT:
        with open(REPORT, "w") as out:
            json.dump(_seen, out, indent=2, default=str)
