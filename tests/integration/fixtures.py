"""Fixtures for tests that run real workers against the real Redis and RabbitMQ.

Imported by the conftest of tests/integration and tests/e2e.
"""

from __future__ import annotations

import pytest
from harness import Run, Worker, check_services


@pytest.fixture(scope="session", autouse=True)
def _services():
    check_services()


@pytest.fixture(params=["redis", "amqp"])
def broker(request):
    return request.param


@pytest.fixture
def make_run(broker):
    runs = []

    def factory(**kwargs):
        run = Run(broker, **kwargs)
        runs.append(run)
        return run

    yield factory
    for run in runs:
        run.cleanup()


@pytest.fixture
def start_worker(tmp_path):
    workers = []

    def factory(run, **kwargs):
        worker = Worker(run, log_dir=tmp_path, **kwargs)
        workers.append(worker)
        return worker.start()

    yield factory
    for worker in workers:
        worker.stop()
