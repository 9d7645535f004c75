"""Returning a held message to the broker, read back from Kombu's in-memory transport."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from celery import Celery

from celery_fair.worker.headers import REPUBLISHED, SUBMITTED, parse_headers
from celery_fair.worker.returns import return_to_queue


@pytest.fixture
def app():
    app = Celery("t", broker="memory://", set_as_current=False)
    yield app
    app.close()


def test_a_message_whose_republished_count_is_bad_goes_back_counted_from_one(app):
    with app.connection_for_write() as conn:
        queue = conn.SimpleQueue("returns")
        queue.put({"x": 1}, headers={REPUBLISHED: "x", SUBMITTED: 12.0, "job_type": "clone"})
        message = queue.get(timeout=1)
        parsed = parse_headers(message.headers, declared_type="clone", types={"clone": ""})
        return_to_queue(app, SimpleNamespace(_message=message), 99.0, parsed.republished)
        again = queue.get(timeout=1)
        assert (again.headers[REPUBLISHED], again.headers[SUBMITTED]) == (1, 12.0)
        assert again.payload == {"x": 1}
        again.ack()
        queue.close()
