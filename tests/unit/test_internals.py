"""The Celery internals the gate relies on (worker/internals.py), checked on the installed
Celery: a pool call names its request, whichever request class Celery builds."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.contrib.testing.mocks import TaskMessage
from celery.worker import state as worker_state
from celery.worker.request import Request, create_request_cls

from celery_fair.worker.headers import request_uid
from celery_fair.worker.internals import (
    already_revoked,
    ends_on_loop,
    pool_size,
    request_of,
    revoked_marker,
)


class Pool:
    """Records what ``Request.execute_using_pool`` passes to the pool."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def apply_async(self, target, args=None, kwargs=None, **options):
        self.calls.append(options)


@pytest.fixture
def app():
    app = Celery(set_as_current=False)

    @app.task(name="t.add", shared=False)
    def add(x, y):
        return x + y

    yield app
    app.close()


@pytest.mark.parametrize("kind", ["Request", "create_request_cls"])
def test_a_pool_call_names_its_request_even_when_two_share_a_task_id(app, kind):
    task, pool = app.tasks["t.add"], Pool()
    cls = Request
    if kind == "create_request_cls":  # the class Celery's default strategy builds
        cls = create_request_cls(Request, task, pool, "host", None, app=app)
    first, second = (
        cls(TaskMessage("t.add", id="same", args=(1, 2)), app=app, task=task) for _ in range(2)
    )
    for req in (first, second):
        req.execute_using_pool(pool)
    assert [request_of(options) for options in pool.calls] == [first, second]
    assert request_of({"callback": None, "correlation_id": "same"}) is None


def test_a_request_celery_found_revoked_is_seen_as_revoked(app):
    task = app.tasks["t.add"]
    req = Request(TaskMessage("t.add", id="gone"), app=app, task=task)
    assert not already_revoked(req)
    worker_state.revoked.add("gone")
    try:
        assert req.revoked()  # Celery acks it and will never hand it to the pool
    finally:
        worker_state.revoked.discard("gone")
    assert already_revoked(req)


def test_a_replacement_and_a_retry_are_other_jobs_than_the_task_they_follow():
    first = request_uid("abc", {"retries": 0, "replaced_task_nesting": 0})
    retry = request_uid("abc", {"retries": 1})
    replacement = request_uid("abc", {"retries": 0, "replaced_task_nesting": 1})
    assert len({first, retry, replacement}) == 3
    assert request_uid("abc", {}) == first == "abc"


def test_pool_size_and_which_pools_end_jobs_on_the_loop():
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.solo import TaskPool as Solo
    from celery.concurrency.thread import TaskPool as Threads

    prefork, threads, solo = Prefork(limit=3), Threads(limit=5), Solo()
    try:
        assert pool_size(prefork) == 3  # before its processes exist
        assert pool_size(threads) == 5
        assert [ends_on_loop(p) for p in (prefork, threads, solo)] == [True, True, False]
    finally:
        threads.on_stop()


def test_the_revoked_marker_moves_with_every_revoke():
    before = revoked_marker()
    worker_state.revoked.add("marker-test")
    try:
        assert revoked_marker() != before
    finally:
        worker_state.revoked.discard("marker-test")


def test_the_revoked_marker_moves_when_a_full_set_evicts_and_a_scheme_gets_more_stamps():
    from celery.utils.collections import LimitedSet

    saved = worker_state.revoked, dict(worker_state.revoked_stamps)
    try:
        # a revoked set at its maxlen: each new id evicts one, the size stays
        worker_state.revoked = LimitedSet(maxlen=2)
        worker_state.revoked.add("a")
        worker_state.revoked.add("b")
        before = revoked_marker()
        worker_state.revoked.add("c")
        assert len(worker_state.revoked) == 2
        assert revoked_marker() != before
        # a second revoke by stamped headers under a scheme already known
        worker_state.revoked_stamps["mtask_id"] = ["x"]
        before = revoked_marker()
        worker_state.revoked_stamps["mtask_id"] = ["x", "y"]
        assert revoked_marker() != before
    finally:
        worker_state.revoked = saved[0]
        worker_state.revoked_stamps.clear()
        worker_state.revoked_stamps.update(saved[1])


def test_each_queue_is_consumed_with_its_window_and_none_without_one_sees_the_channels_lifted():
    """consume_with_windows on a real Kombu Consumer (in-memory channel, its AMQP calls
    recorded): RabbitMQ lifts the channel's window while a consumer's is set."""
    from kombu import Connection, Consumer, Queue

    from celery_fair.worker.internals import consume_with_windows, reconsume

    calls: list[tuple] = []
    with Connection("memory://") as conn:
        channel = conn.channel()
        channel.basic_qos = lambda size, count, is_global: calls.append(("qos", count, is_global))
        plain_consume = channel.basic_consume

        def basic_consume(queue, *args, **kwargs):
            calls.append(("consume", queue))
            return plain_consume(queue, *args, **kwargs)

        channel.basic_consume = basic_consume
        channel.basic_cancel = lambda tag, **kwargs: calls.append(("cancel", tag))
        windows = {"q": 0, "q.fair.0": 3, "q.fair.1": 3}
        consumer = Consumer(channel, queues=[Queue(name) for name in windows])
        consume_with_windows(consumer, windows.__getitem__, lambda: 10)
        # The queues with a window of their own first, each change of window followed by the
        # channel's; the queue without one last.
        consumer.consume()
        assert calls == [
            ("qos", 3, False),
            ("qos", 10, True),
            ("consume", "q.fair.0"),
            ("consume", "q.fair.1"),
            ("qos", 0, False),
            ("qos", 10, True),
            ("consume", "q"),
        ]
        # A shard consumed again with a wider window: the queue without one is taken off the
        # channel before the window changes, and consumed again after.
        calls.clear()
        windows["q.fair.1"] = 11
        assert reconsume(consumer, ["q.fair.1", "gone"]) == ["gone"]
        kinds = [c[0] if c[0] != "consume" else c for c in calls]
        assert kinds == [
            "cancel",  # q.fair.1
            "cancel",  # q
            "qos",
            "qos",
            ("consume", "q.fair.1"),
            "qos",
            "qos",
            ("consume", "q"),
        ]
        assert calls[2:4] == [("qos", 11, False), ("qos", 10, True)]
        assert set(consumer._active_tags) == set(windows)


class _Connection:
    def __init__(self, spec: bool, driver: str = "amqp") -> None:
        self.qos_semantics_matches_spec = spec
        self.transport = type("T", (), {"driver_type": driver})()


class _Consumer:
    def __init__(self, app, spec: bool, recorded=None) -> None:
        self.app = app
        self.connection = _Connection(spec)
        if recorded != "absent":
            self.qos_global = recorded


@pytest.mark.parametrize("quorum", [False, True])
@pytest.mark.parametrize("spec", [False, True])
def test_the_channel_window_rule_is_celerys_where_celery_recorded_none(app, spec, quorum):
    """Celery 5.7 records ``qos_global``; an older one does not, and the same rule decides.
    Where the installed Celery has the rule as a method, both answers agree."""
    from celery.worker.consumer.tasks import Tasks
    from kombu import Queue

    from celery_fair.worker.internals import channel_window_is_global

    if quorum:
        app.conf.task_queues = [Queue("q", queue_arguments={"x-queue-type": "quorum"})]
    expected = not spec and not quorum
    assert channel_window_is_global(_Consumer(app, spec, recorded="absent")) is expected
    assert channel_window_is_global(_Consumer(app, spec, recorded=None)) is expected
    assert channel_window_is_global(_Consumer(app, spec, recorded=not expected)) is not expected
    if hasattr(Tasks, "qos_global"):
        assert Tasks.qos_global(object.__new__(Tasks), _Consumer(app, spec)) is expected


def test_a_redis_channel_names_its_lists_as_kombu_does_and_only_once_per_queue():
    # On Kombu's real Redis channel (a Redis server: the one the tests use),
    from kombu import Connection

    from celery_fair.worker.internals import LIST_NAMES_KEPT, remember_list_names

    with Connection("redis://127.0.0.1:6379/15") as conn:
        channel = conn.default_channel
        kombus = type(channel)._q_for_pri
        calls = []
        channel._q_for_pri = lambda q, p: calls.append((q, p)) or kombus(channel, q, p)
        assert remember_list_names(channel)
        assert not remember_list_names(channel)  # once
        queues = ["q", *(f"q.fair.{i}" for i in range(8)), "q.fair.lane.3"]
        # every name is Kombu's, for each priority a message or a BRPOP may name,
        for _ in range(2):
            for queue in queues:
                for pri in range(10):
                    assert channel._q_for_pri(queue, pri) == kombus(channel, queue, pri)
        # and Kombu's own code named each only once.
        assert len(calls) == len(queues) * 10
        # A channel that names ever new queues starts again rather than grow without end.
        for i in range(LIST_NAMES_KEPT + 1):
            channel._q_for_pri(f"reply-{i}", 0)
        assert channel._q_for_pri("q", 3) == kombus(channel, "q", 3)
        assert len(calls) == len(queues) * 10 + LIST_NAMES_KEPT + 2


def test_a_brpop_packed_from_its_names_packed_once_is_the_bytes_redis_py_packs():
    # Kombu's real Redis channel, its names as its _brpop_start builds them:
    from kombu import Connection

    from celery_fair.worker.internals import LIST_NAMES_KEPT, _NamesPacker

    for url, options in (
        ("redis://127.0.0.1:6379/15", {}),
        ("redis://127.0.0.1:6379/15", {"global_keyprefix": "pre:"}),
    ):
        with Connection(url, transport_options=options) as conn:
            channel = conn.default_channel
            connection = channel.client.connection_pool.get_connection()
            redis_pys = connection._command_packer
            packer = _NamesPacker(redis_pys, connection.encoder.encode, ["BRPOP"])
            queues = ["q", "ünï", *(f"q.fair.{i}" for i in range(8)), "q.fair.lane.3"]
            keys = [channel._q_for_pri(q, p) for p in channel.priority_steps for q in queues]
            for timeout in (1, 1.0, 0, 2.5):
                args = ["BRPOP", *keys, timeout]
                if channel.global_keyprefix:
                    args = channel.client._prefix_args(args)
                for _ in range(2):  # packing the names, then from the names packed
                    assert b"".join(packer.pack(*args)) == b"".join(redis_pys.pack(*args))
            assert len(packer.names) == len(keys) + 1  # and BRPOP itself
            # every other command is redis-py's own packing,
            other = ("LPUSH", keys[0], b"\x00payload")
            assert packer.pack(*other) == redis_pys.pack(*other)
            odd = ("BRPOP", keys[0], memoryview(b"x"), 1)  # not a str
            assert b"".join(packer.pack(*odd)) == b"".join(map(bytes, redis_pys.pack(*odd)))
            # and a reader of ever new lists starts again rather than grow without end.
            for i in range(LIST_NAMES_KEPT + 1):
                packer.pack("BRPOP", f"reply-{i}", 1)
            assert len(packer.names) <= LIST_NAMES_KEPT
            connection.disconnect()


def test_a_redis_channel_reads_with_its_names_packed_once_on_each_connection_it_polls():
    import kombu

    from celery_fair.worker.internals import _NamesPacker, pack_reads_once

    got: list[object] = []
    queue = kombu.Queue("fair-pack-test", routing_key="fair-pack-test")
    with kombu.Connection("redis://127.0.0.1:6379/15") as conn:
        channel = conn.channel()
        assert pack_reads_once(channel)
        assert not pack_reads_once(channel)  # once
        assert not pack_reads_once(object())  # not a Redis channel
        queue(channel).declare()
        channel.queue_purge("fair-pack-test")  # (a run stopped before its end)
        with kombu.Consumer(channel, [queue], callbacks=[lambda body, m: got.append(body)]):
            producer = kombu.Producer(conn.channel())
            for n in range(2):
                producer.publish({"n": n}, routing_key="fair-pack-test", declare=[queue])
                conn.drain_events(timeout=5)
                polled = channel.client.connection
                assert type(polled._command_packer) is _NamesPacker
                assert any("fair-pack-test" in name for name in polled._command_packer.names)
                # Kombu gives the channel a new connection after this one drops: it packs so too.
                polled.disconnect()
        assert got == [{"n": 0}, {"n": 1}]
        channel.queue_delete("fair-pack-test")


def test_the_intakes_script_calls_pack_their_names_once_and_answer_as_before():
    import redis

    from celery_fair.redis_broker import MOVE_SCRIPT
    from celery_fair.worker.internals import _NamesPacker, pack_scripts_once

    client = redis.Redis.from_url("redis://127.0.0.1:6379/15")
    assert pack_scripts_once(client)
    echo = client.register_script("return {#KEYS, KEYS[#KEYS], ARGV[1], ARGV[#ARGV]}")
    keys = [f"q.fair.{i}\x06\x16{p}" for p in range(4) for i in range(25)]
    for last in (7, 2.5, "ünï", b"raw"):
        reply = echo(keys=keys, args=["queue", 0, last])
        assert reply == [100, keys[-1].encode(), b"queue", str(last).encode()
                         if not isinstance(last, bytes) else last]  # fmt: skip
    connection = client.connection_pool.get_connection()
    try:
        packer = connection._command_packer
        assert type(packer) is _NamesPacker
        assert keys[0] in packer.names  # the names were packed once, and kept
        sha = client.script_load(MOVE_SCRIPT)
        args = ("EVALSHA", sha, len(keys), *keys, "h", 8, 4, 100, 16, 0.5, "queue", "")
        assert b"".join(packer.pack(*args)) == b"".join(packer.inner.pack(*args))
        assert packer.pack("GET", "x") == packer.inner.pack("GET", "x")  # not a script
    finally:
        client.connection_pool.release(connection)
        client.close()
