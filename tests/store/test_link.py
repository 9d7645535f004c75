"""The worker's non-blocking store link (worker/link.py) against the real Redis.

The link needs a loop that watches its socket and fires its deadline. Celery's loop is driven
by the worker; here a small recording loop stands in for it, so the test can choose the order
in which the socket is read and the deadline fires (the case it is about: the reply has come
but the loop has not polled since).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from harness import wait_until
from shared_redis import REDIS_URL, clean
from test_contract import ask

from celery_fair.engine import AdmitCall, Call
from celery_fair.errors import StoreUnavailable
from celery_fair.store import RedisStore, Reply, Verdict
from celery_fair.worker.link import StoreLink, _readable


class RecordingLoop:
    """What the link asks of Kombu's hub: readers and timers, recorded, fired by the test."""

    def __init__(self) -> None:
        self.readers: dict[int, Any] = {}
        self.timers: list[_Timer] = []

    def add_reader(self, fd: int, callback: Any) -> None:
        self.readers[fd] = callback

    def remove_reader(self, fd: int) -> None:
        self.readers.pop(fd, None)

    def call_later(self, seconds: float, callback: Any, *args: Any) -> _Timer:
        timer = _Timer(callback, args)
        self.timers.append(timer)
        return timer

    def call_soon(self, callback: Any, *args: Any) -> None:
        callback(*args)

    def fire_timers(self) -> None:
        for timer in [t for t in self.timers if not t.cancelled]:
            timer.cancelled = True
            timer.callback(*timer.args)


class _Timer:
    def __init__(self, callback: Any, args: tuple[Any, ...]) -> None:
        self.callback, self.args, self.cancelled = callback, args, False

    def cancel(self) -> None:
        self.cancelled = True


@pytest.fixture
def store(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    made = RedisStore(redis.Redis.from_url(REDIS_URL), prefix)
    yield made
    made.close()
    clean(redis_client, prefix)


def _admit_one(uid: str) -> Call:
    call = AdmitCall("w1")
    call.asks = [ask(uid, job_id="linux.git")]
    return call


def _answered(loop: RecordingLoop) -> bool:
    return any(_readable(fd) for fd in loop.readers)


def _answered_in_flight(store: RedisStore) -> tuple[RecordingLoop, StoreLink, list[Any]]:
    """A link with one admit call sent, whose answer has come and is not read yet."""
    loop = RecordingLoop()
    delivered: list[Any] = []
    link = StoreLink(store, loop, lambda call, result: delivered.append(result), timeout=5.0)
    link.submit(_admit_one("j1"))
    wait_until(lambda: _answered(loop), 5, "Redis answers the call")
    return loop, link, delivered


def test_a_reply_that_came_while_the_loop_was_busy_is_taken_when_the_deadline_fires(store):
    # Given a call in flight whose reply has arrived but has not been read (the loop is busy)
    loop, link, delivered = _answered_in_flight(store)

    # When the deadline fires before the loop reads the socket
    loop.fire_timers()

    # Then the reply is taken, not a timeout: the job is admitted and the link stays usable
    assert len(delivered) == 1
    assert isinstance(delivered[0], Reply), delivered[0]
    assert [g.verdict for g in delivered[0].grants] == [Verdict.ADMITTED]
    link.submit(_admit_one("j2"))
    wait_until(lambda: _answered(loop), 5, "Redis answers the second call")
    for callback in list(loop.readers.values()):
        callback()
    assert [g.verdict for g in delivered[1].grants] == [Verdict.CONFLICT]  # j1 holds linux.git
    link.close()


def test_a_call_with_no_reply_by_its_deadline_fails_as_unavailable(store):
    # Given a call in flight whose reply never reaches the link (the test reads it off the
    # socket first, as if it had been lost on the way)
    loop, link, delivered = _answered_in_flight(store)
    link._wire.sock.recv(65536)
    assert not _answered(loop)

    # When the deadline fires
    loop.fire_timers()

    # Then the call fails as the store being unavailable, and the connection is let go
    assert len(delivered) == 1
    assert isinstance(delivered[0], StoreUnavailable)
    assert not loop.readers
