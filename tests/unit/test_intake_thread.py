"""The intake's thread (intake/__init__.py) through a Redis outage, with a stand-in intake
whose calls fail the way redis-py's do (the script itself: tests/integration/test_intake.py)."""

from __future__ import annotations

import logging
import threading

import redis

from celery_fair.intake import IntakeThread


class OutageThenBack:
    """Raises redis-py's ConnectionError for the first ``failures`` calls, then moves nothing."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.back = threading.Event()

    def drain(self, queues):
        self.calls += 1
        if self.calls <= self.failures:
            raise redis.ConnectionError("Connection refused")
        self.back.set()
        return 0


def test_the_intake_rides_out_an_outage_with_one_warning_and_carries_on(caplog):
    intake = OutageThenBack(failures=3)
    thread = IntakeThread(intake, lambda: ["q"], interval=0.01)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="celery_fair.intake"):
        thread.start()
        assert intake.back.wait(5)
        thread.stop()
    assert not thread.is_alive()
    messages = [r.getMessage() for r in caplog.records if r.name == "celery_fair.intake"]
    assert [m.split(":")[1].strip().split(" (")[0] for m in messages] == [
        "cannot move messages",
        "moving messages again.",
    ]
