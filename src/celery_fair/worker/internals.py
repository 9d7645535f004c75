"""What the gate reads of Celery's and Kombu's insides that is not their public API.

Each helper names the internal it relies on, and nothing else in celery-fair reaches past
Celery's and Kombu's public API but ``redis_broker.py``, which names those of the Kombu Redis
channel that producers need too (its lists' names, its server's connection pool). Checked
against celery 5.7.0, kombu 5.7.0 and billiard 4.3.2 (the versions
``tests/unit/test_internals.py`` runs on, with Celery's own Request classes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from celery.concurrency.prefork import TaskPool as _PreforkPool
from celery.concurrency.thread import TaskPool as _ThreadPool
from celery.exceptions import TimeLimitExceeded
from celery.utils.log import get_logger
from celery.worker import state as worker_state
from kombu.common import PREFETCH_COUNT_MAX

__all__ = [
    "ack_quietly",
    "already_revoked",
    "applied_prefetch",
    "channel_window_is_global",
    "consume_with_windows",
    "ends_on_loop",
    "hit_time_limit",
    "message_of",
    "note_redis_sources",
    "order_redis_reads",
    "pack_reads_once",
    "pack_scripts_once",
    "pool_size",
    "reconsume",
    "remember_list_names",
    "request_of",
    "revoked_marker",
    "scheduled_by_queue",
    "sends_events",
    "writes_pending",
]

logger = get_logger(__name__)


def request_of(options: dict[str, Any]) -> Any:
    """The ``Request`` whose run a pool's ``apply_async`` call is, or ``None``.

    ``Request.execute_using_pool`` (and the fast request class of ``create_request_cls``)
    passes the request's own bound methods as ``callback`` and ``error_callback``, so each call
    names the very request it runs, whatever its task id: Celery reuses a task id for a
    ``Task.replace`` replacement, and a duplicated message carries its original's.
    """
    for name in ("callback", "error_callback"):
        owner = getattr(options.get(name), "__self__", None)
        if owner is not None and hasattr(owner, "request_dict"):
            return owner
    return None


def message_of(req: Any) -> Any:
    """The Kombu message ``req`` came in (``Request._message``): to republish or ack it."""
    return req._message


def sends_events(req: Any) -> bool:
    """Whether ``req`` sends task events now (``Request._eventer``, as ``send_event`` checks)."""
    eventer = req._eventer
    return bool(eventer and eventer.enabled and req.task.send_events)


def already_revoked(req: Any) -> bool:
    """Whether Celery found ``req`` revoked or expired (``Request._already_revoked``), which it
    acknowledges and never hands to the pool."""
    return bool(getattr(req, "_already_revoked", False))


def writes_pending(pool: Any) -> bool:
    """Whether the prefork pool holds jobs it has yet to write to a process
    (``AsynPool.outbound_buffer``); ``False`` for every other pool."""
    return bool(getattr(getattr(pool, "_pool", None), "outbound_buffer", None))


def ack_quietly(req: Any) -> None:
    """Acknowledge ``req``'s message (``Request._message``) unless it already is, logging a
    failure instead of raising it."""
    message = getattr(req, "_message", None)
    if message is not None and not message.acknowledged:
        message.ack_log_error(logger, (Exception,))


def revoked_marker() -> tuple[int, int, int]:
    """Changes whenever a task id or stamped header is revoked.

    Sizes alone do not: ``worker.state.revoked`` is a ``LimitedSet`` that stays at its
    ``maxlen`` once full (each new id evicts an old one), and ``revoked_stamps`` (celery 5.3+)
    maps a stamping scheme to a list that a second revoke under the same scheme lengthens
    without adding a key. So: the set's size, the sequence number of its newest entry (every
    ``add`` takes a new one), and the number of stamps in all. O(schemes)."""
    revoked = worker_state.revoked
    data = getattr(revoked, "_data", None)
    newest = -1
    if data:
        entry = data[next(reversed(data))]
        newest = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else len(data)
    stamps = getattr(worker_state, "revoked_stamps", None) or {}
    count = sum(len(v) if isinstance(v, (list, tuple, set)) else 1 for v in stamps.values())
    return len(revoked), newest, count


def pool_size(pool: Any) -> int:
    """The pool's processes (or threads, greenlets) now: ``num_processes``, which autoscale
    moves; ``limit`` for a prefork pool whose processes do not exist yet."""
    try:
        return int(pool.num_processes or 0)
    except AttributeError:
        return int(getattr(pool, "limit", 0) or 0)


def ends_on_loop(pool: Any) -> bool:
    """Whether the pool reports a job's end on the consumer's event loop (prefork, and threads
    through ``hub.call_soon``): the gate's reserve needs that."""
    return isinstance(pool, (_PreforkPool, _ThreadPool))


def hit_time_limit(einfo: Any) -> bool:
    """Whether a pool's error callback reports a hard time limit. Billiard hands it an
    ``ExceptionInfo`` whose ``exception`` is a wrapper (``ExceptionWithTraceback``), so the
    exception's class is read from ``type``."""
    kind = getattr(einfo, "type", None)
    if not isinstance(kind, type):
        kind = type(getattr(einfo, "exception", einfo))
    return issubclass(kind, TimeLimitExceeded)


class _OrderedCycle:
    """Kombu's Redis queue cycle (``round_robin_cycle``: ``update``, ``consume``, ``rotate``),
    with ``consume``'s turn order passed through ``order``."""

    def __init__(self, inner: Any, order: Callable[[list[str]], list[str]]) -> None:
        self.inner = inner
        self.order = order

    def update(self, queues: Iterable[str]) -> None:
        self.inner.update(queues)

    def consume(self, n: int) -> list[str]:
        return self.order(list(self.inner.consume(n)))

    def rotate(self, last_used: str) -> Any:
        return self.inner.rotate(last_used)


def order_redis_reads(channel: Any, order: Callable[[list[str]], list[str]]) -> bool:
    """Make the Redis transport's ``BRPOP`` list ``channel``'s queues in ``order(turns)``.
    Kombu's ``Channel._queue_cycle`` (kombu.transport.redis), which ``_brpop_start`` consumes
    and ``_brpop_read`` rotates. False if the channel has none (another transport). The
    channel's list names are remembered too (``remember_list_names``), and packed once
    (``pack_reads_once``)."""
    cycle = getattr(channel, "_queue_cycle", None)
    if cycle is None or not all(hasattr(cycle, m) for m in ("update", "consume", "rotate")):
        return False
    if isinstance(cycle, _OrderedCycle):
        cycle.order = order
    else:
        channel._queue_cycle = _OrderedCycle(cycle, order)
    remember_list_names(channel)
    pack_reads_once(channel)
    return True


#: How many list names ``remember_list_names`` keeps before it starts again.
LIST_NAMES_KEPT = 4096


def remember_list_names(channel: Any) -> bool:
    """Remember the names of ``channel``'s Redis lists. Kombu's Redis ``_brpop_start`` names
    every consumed queue's list at every priority step (``Channel._q_for_pri``: a bisect and
    a string built) for each ``BRPOP``, that is for each message it reads: with 8 shards and
    16 lanes, 100 names, about 10 µs a message. A name depends only on the queue and the
    priority (``priority_steps`` and ``sep`` are the channel's for life), so a dictionary
    answers the second time (at most ``LIST_NAMES_KEPT``: a channel that published to ever new
    queues would otherwise grow it). False if ``channel`` has no ``_q_for_pri`` (another
    transport), or remembers already."""
    named = getattr(channel, "_q_for_pri", None)
    if named is None or getattr(named, "remembers", False):
        return False
    names: dict[tuple[str, Any], str] = {}

    def q_for_pri(queue: str, pri: Any) -> str:
        try:
            return names[queue, pri]
        except KeyError:
            if len(names) >= LIST_NAMES_KEPT:
                names.clear()
            name: str = named(queue, pri)
            names[queue, pri] = name
            return name

    q_for_pri.remembers = True  # type: ignore[attr-defined]
    channel._q_for_pri = q_for_pri
    return True


class _NamesPacker:
    """A redis-py command packer (``Connection._command_packer``: ``pack(*args)`` gives the
    list of bytes ``send_packed_command`` writes) that packs the commands in ``commands``
    with each ``str`` argument packed once, and gives every other command to the packer it
    wraps. For the commands whose ``str`` arguments are names from a small set: a
    ``BRPOP``'s lists, the intake's script and the lists it names.

    redis-py encodes each argument of a command in Python (``Encoder.encode``, then a
    generator over the arguments): for a ``BRPOP`` of 100 names, 174 µs a read on a slow
    host, against 8 µs to join the names packed once. The protocol is RESP's request, an
    array of bulk strings, the same bytes for every connection of one encoder."""

    def __init__(self, inner: Any, encode: Callable[[Any], bytes], commands: Iterable[str]) -> None:
        self.inner = inner
        self.encode = encode
        self.commands = frozenset(commands)
        self.names: dict[str, bytes] = {}

    def pack(self, *args: Any) -> list[bytes]:
        if args[0] not in self.commands:
            return self.inner.pack(*args)  # type: ignore[no-any-return]
        names = self.names
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            if type(arg) is str:
                packed = names.get(arg)
                if packed is None:
                    if len(names) >= LIST_NAMES_KEPT:
                        names.clear()
                    packed = names[arg] = self._bulk(arg)
            else:  # a number (1 and 1.0 are one key to a dictionary), bytes: each time
                packed = self._bulk(arg)
            parts.append(packed)
        return [b"".join(parts)]

    def _bulk(self, value: Any) -> bytes:
        data = self.encode(value)
        return b"$%d\r\n%s\r\n" % (len(data), data)

    @classmethod
    def put_on(cls, connection: Any, commands: Iterable[str]) -> None:
        """Pack ``connection``'s ``commands`` so, unless it does already (or it is no
        redis-py connection)."""
        packer = getattr(connection, "_command_packer", None)
        if packer is not None and type(packer) is not cls:
            connection._command_packer = cls(packer, connection.encoder.encode, commands)


def pack_reads_once(channel: Any) -> bool:
    """Let ``channel``'s ``BRPOP``s pack each list name once (``_NamesPacker``). Kombu's Redis
    ``_brpop_start`` sends the command on ``channel.client.connection``, which Kombu replaces
    after a disconnect, so the packer goes on whichever connection it is about to use. False
    if ``channel`` has no ``_brpop_start`` (another transport), or packs so already."""
    start = getattr(channel, "_brpop_start", None)
    if start is None or getattr(start, "packs_once", False):
        return False

    def _brpop_start(timeout: Any = None) -> Any:
        _NamesPacker.put_on(getattr(channel.client, "connection", None), ("BRPOP",))
        return start(timeout)

    _brpop_start.packs_once = True  # type: ignore[attr-defined]
    channel._brpop_start = _brpop_start
    return True


def note_redis_sources(channel: Any, on_read: Callable[[str | None], None]) -> bool:
    """Tell ``on_read`` the queue each message of ``channel``'s transport is delivered from,
    during its delivery (then ``None``). Kombu's Redis ``_brpop_read`` hands the message and
    the list it popped it from to ``Transport._deliver(message, queue)``, which calls the
    consumer (Celery's strategy, and the gate) before it returns; the message itself says
    only the routing key it was published with. False if ``channel`` has no such transport,
    or notes already (then ``on_read`` is the new one)."""
    transport: Any = getattr(channel, "connection", None)
    deliver = getattr(transport, "_deliver", None)
    if deliver is None or not hasattr(channel, "_brpop_read"):
        return False
    if getattr(deliver, "notes", None) is not None:
        deliver.notes[0] = on_read
        return False
    notes = [on_read]

    def _deliver(message: Any, queue: str) -> Any:
        tell = notes[0]
        tell(queue)
        try:
            return deliver(message, queue)
        finally:
            tell(None)

    _deliver.notes = notes  # type: ignore[attr-defined]
    transport._deliver = _deliver
    return True


def pack_scripts_once(client: Any) -> bool:
    """Let a redis-py ``client``'s script calls (``EVALSHA``) pack each ``str`` argument once
    (``_NamesPacker``), on every connection its pool makes (``ConnectionPool.make_connection``,
    which redis-py calls for each new connection). For the intake's client, whose script names
    every shard and lane of a queue. False if its pool has no ``make_connection``."""
    pool = getattr(client, "connection_pool", None)
    make = getattr(pool, "make_connection", None)
    if make is None:
        return False

    def make_connection(*args: Any, **kwargs: Any) -> Any:
        connection = make(*args, **kwargs)
        _NamesPacker.put_on(connection, ("EVALSHA", "EVAL"))
        return connection

    pool.make_connection = make_connection  # type: ignore[union-attr]
    return True


def consume_with_windows(
    task_consumer: Any, window_of: Callable[[str], int], channel_window: Callable[[], int]
) -> None:
    """Make ``task_consumer`` (a Kombu ``Consumer`` on an AMQP channel) consume each queue with
    a window of its own, ``window_of(queue)`` (0: none), inside the channel's window,
    ``channel_window()``. Replaces the instance's ``consume``, which the worker's loop and
    ``add_consumer`` call; it consumes the queues one by one as Kombu's does
    (``Consumer._queues``, ``_active_tags``, ``_basic_consume``), waiting for each
    ``consume-ok``.

    RabbitMQ (checked on 3.10.8) lifts the channel's window whenever a consumer's window is
    set (``basic.qos`` with ``global=false``), and applies both to a consumer created after the
    channel's is set again. In that moment a consumer with no window of its own would be sent
    its queue's whole backlog: so such consumers are cancelled first and consumed again last,
    after the channel's window is back (``global=true``)."""
    channel = task_consumer.channel
    sent = [-1]  # the consumer window last sent: basic.qos is a round trip
    unwindowed: set[str] = set()  # queues consumed without a window of their own

    def consume(no_ack: bool | None = None) -> None:
        queues = task_consumer._queues
        active = task_consumer._active_tags
        windows = {name: window_of(name) for name in queues if name not in active}
        if not windows:
            return
        if any(w != sent[0] for w in windows.values()):
            for name in [n for n in active if n in queues and n in unwindowed]:
                _unconsume(task_consumer, name)
                windows[name] = 0
        # the queues with a window of their own first: no consumer without one is on the
        # channel while its window is lifted
        for name in sorted(windows, key=lambda n: windows[n] == 0):
            window = windows[name]
            if window != sent[0]:
                channel.basic_qos(0, window, False)
                channel.basic_qos(0, channel_window(), True)
                sent[0] = window
            task_consumer._basic_consume(
                queues[name],
                no_ack=task_consumer.no_ack if no_ack is None else no_ack,
                nowait=False,
            )
            if window == 0:
                unwindowed.add(name)
            else:
                unwindowed.discard(name)

    task_consumer.consume = consume


def channel_window_is_global(c: Any) -> bool:
    """Whether Celery's task window is the channel's (``basic.qos`` with ``global``), as
    Celery's ``Tasks.qos_global`` decides: RabbitMQ's semantics, unless quorum queues make the
    window per consumer. Celery 5.7 records the answer as ``consumer.qos_global`` in
    ``Tasks.start``; an older Celery does not, so the same rule is applied here."""
    recorded = getattr(c, "qos_global", None)
    if recorded is not None:
        return bool(recorded)
    if c.connection.qos_semantics_matches_spec:
        return False
    if not c.app.conf.get("worker_detect_quorum_queues", False):
        return True
    try:
        from celery.utils.quorum_queues import detect_quorum_queues
    except ImportError:  # a Celery without quorum queues keeps the channel's window
        return True
    return not detect_quorum_queues(c.app, c.connection.transport.driver_type)[0]


def applied_prefetch(qos: Any) -> int:
    """The channel window Celery last set through its ``QoS`` (Kombu's ``QoS.prev``: the value
    the last ``set`` sent, 0 above ``PREFETCH_COUNT_MAX``; ``value`` before any)."""
    value = qos.prev if qos.prev is not None else qos.value
    return 0 if value > PREFETCH_COUNT_MAX else int(value)


def reconsume(task_consumer: Any, names: Iterable[str]) -> list[str]:
    """Cancel the consumers of ``names`` and consume them again (with the windows
    ``consume_with_windows`` gives them now); returns those not consumed at all. Unacked
    messages stay with the channel; one delivered between the cancel and its ``cancel-ok`` is
    handled as usual, and one after it is rejected back to its queue by py-amqp
    (``Channel._on_basic_deliver``)."""
    gone = []
    for name in names:
        if name in task_consumer._queues and name in task_consumer._active_tags:
            _unconsume(task_consumer, name)
        else:
            gone.append(name)
    task_consumer.consume()
    return gone


def _unconsume(task_consumer: Any, name: str) -> None:
    """Cancel the consumer of queue ``name`` but keep the queue, so that the next ``consume``
    consumes it again (``cancel_by_queue`` forgets the queue; ``add_queue`` declares it anew)."""
    queue = task_consumer._queues[name]
    task_consumer.cancel_by_queue(name)
    task_consumer.add_queue(queue)


def scheduled_by_queue(task_consumer: Any) -> Counter[str]:
    """How many requests Celery keeps in its timer until their ETA, unacknowledged
    (``worker.state.scheduled_requests``), per queue ``task_consumer`` consumed them from: each
    message's ``consumer_tag`` (py-amqp's ``delivery_info``) looked up in the consumer's active
    tags (``Consumer._active_tags``). O(queues + scheduled requests)."""
    queue_of = {tag: name for name, tag in task_consumer._active_tags.items()}
    counts: Counter[str] = Counter()
    for req in list(worker_state.scheduled_requests):
        tag = (getattr(message_of(req), "delivery_info", None) or {}).get("consumer_tag")
        name = queue_of.get(tag)
        if name is not None:
            counts[name] += 1
    return counts
