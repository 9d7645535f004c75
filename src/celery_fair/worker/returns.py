"""Messages the gate gives back to the broker: returned to their queue, or dead-lettered.

Both publish a copy first and acknowledge the original only once the broker has the copy
(``retry=True`` rides out a reconnect), so a crash in between leaves two copies, never none:
at least once (docs/operations.md#beyond-fair_max_held-spilling).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.utils.log import get_logger
from celery.worker import state as worker_state
from kombu.entity import Queue

from ..observe import Observer
from ..protocol import base_name, shard_index
from ..routing import Shards, is_part
from .headers import ERROR, REPUBLISHED, SUBMITTED, request_uid
from .held import Held
from .internals import message_of

__all__ = [
    "Returns",
    "dead_letter",
    "give_back",
    "publish_copy",
    "return_to_queue",
    "send_to_dead_letters",
]

logger = get_logger(__name__)


class Returns:
    """The gate's way out for messages it will not run here: back to the queue, or to the
    dead letters. ``forget`` stops holding a uid; ``untrack`` forgets task ids' tracked
    submissions (``None`` when submissions are not tracked)."""

    def __init__(
        self,
        app: Any,
        observer: Observer,
        *,
        dead_letter_queue: str,
        forget: Callable[[str], None],
        untrack: Callable[[list[str]], None] | None,
    ) -> None:
        self.app = app
        self.observer = observer
        self.dead_letter_queue = dead_letter_queue
        self._forget = forget
        self._untrack = untrack
        # intake_running: an intake moves what is published to this worker's queues into the
        # shards (set by the gate's attach).
        self.intake_running = False
        # relane: the intake moves stragglers to their lanes (Redis): one given back from its
        # shard goes to its lane (return_to_queue).
        self.relane = False

    def give_back(self, held: Held, reason: str, extra: dict[str, Any] | None = None) -> bool:
        """Return a held message to its queue, all headers kept and ``extra`` added, and stop
        holding it; ``False`` if it could not be published (still held). While an intake
        runs, it goes to its key's shard (else back where it came)."""
        req = held.req
        into = (held.headers.fairness_key or None) if self.intake_running else None
        republished = held.headers.republished
        if not give_back(
            self.app,
            req,
            held.arrival,
            republished,
            reason=reason,
            shard_key=into,
            relane=self.relane,
            extra=extra,
        ):
            return False
        self._forget(request_uid(req.id, req.request_dict))
        return True

    def dead_letter(self, req: Any, why: str) -> None:
        """Dead-letter a request that was never held (its headers are refused)."""
        if send_to_dead_letters(self.app, req, why, self.dead_letter_queue):
            self.observer.dead_lettered()
            if self._untrack is not None:  # its submission ended here
                self._untrack([req.id])


def give_back(
    app: Any,
    req: Any,
    arrival: float,
    republished: int,
    *,
    reason: str,
    shard_key: str | None = None,
    relane: bool = False,
    extra: dict[str, Any] | None = None,
) -> bool:
    """Return a held message to its queue (``return_to_queue``) and tell Celery it is done
    here; ``reason`` is logged. ``False`` (logged) if it could not be published: the caller
    still holds it."""
    try:
        return_to_queue(app, req, arrival, republished, shard_key, extra, relane=relane)
    except Exception:
        logger.exception(
            "Could not return held task %s[%s] to the broker (%s); still holding it.",
            req.name,
            req.id,
            reason,
        )
        return False
    worker_state.task_ready(req)
    logger.info("Returned held task %s[%s] to the broker: %s.", req.name, req.id, reason)
    return True


def send_to_dead_letters(app: Any, req: Any, why: str, queue: str) -> bool:
    """Dead-letter ``req`` to ``queue`` (``dead_letter``), then acknowledge it the way Celery
    rejects a message (task ready, a ``task-rejected`` event). If it cannot be published it is
    rejected instead, and this is ``False``."""
    try:
        dead_letter(app, req, why, queue)
    except Exception:
        logger.exception(
            "Could not dead-letter task %s[%s]; rejecting it instead.", req.name, req.id
        )
        req.reject(requeue=False)
        return False
    req.acknowledge()
    worker_state.task_ready(req)
    req.send_event("task-rejected", requeue=False)
    logger.error("Task %s[%s] sent to dead letter queue %r: %s", req.name, req.id, queue, why)
    return True


def return_to_queue(
    app: Any,
    req: Any,
    arrival: float,
    republished: int = 0,
    shard_key: str | None = None,
    extra: dict[str, Any] | None = None,
    *,
    relane: bool = False,
) -> None:
    """Publish ``req``'s message again to the exchange and routing key it came by, every header
    kept (``fair_submitted`` keeps its place in the fair order), then acknowledge it.
    ``fair_republished`` counts the trips: ``republished`` (the count the gate read,
    headers.py) plus this one.

    With ``shard_key``, a message that came to a queue by name (the default exchange) goes to
    the back of that key's shard (or lane) of the queue instead: where the intake puts the
    messages published to the queue, so where those behind it wait (returned to the queue, it
    would be the first one there, and would come straight back). One that came from a shard or
    a lane goes back there, behind what waits there: a straggler sent to its key's lane would
    come straight back from it while the shard it left, and what waits there, went unread.
    But with ``relane`` (on Redis, where the intake moves the stragglers out of their shard to
    the consuming end of their lane, ``IntakeThread.reroute_soon``), one that came from a shard
    goes to the back of its key's lane if it has one: sent back to the shard, it would be
    moved straight back to the front, and giving it back would let nothing behind it through.
    ``extra`` headers are added.

    Raises:
        Exception: Whatever publishing raised; the original is then not acknowledged.
    """
    message = message_of(req)
    headers = _headers(message)
    headers.setdefault(SUBMITTED, arrival)
    headers[REPUBLISHED] = republished + 1
    if extra:
        headers.update(extra)
    info = message.delivery_info or {}
    route: dict[str, Any] = {
        "exchange": info.get("exchange") or "",
        "routing_key": info.get("routing_key"),
    }
    named = route["routing_key"]
    if shard_key and not route["exchange"] and named:
        if not is_part(named):
            Shards.of(app).route(route, shard_key, named)
        elif relane and shard_index(named) is not None:  # its lane, or this shard again
            Shards.of(app).route(route, shard_key, base_name(named))
    _publish(app, message, headers, route["exchange"], route["routing_key"])
    message.ack()


def dead_letter(app: Any, req: Any, why: str, queue: str) -> None:
    """Publish ``req``'s message to the durable queue ``queue`` with ``fair_error`` saying
    ``why``; the caller acknowledges it (Celery's way, with its bookkeeping).

    Raises:
        Exception: Whatever publishing raised.
    """
    message = message_of(req)
    headers = _headers(message)
    headers[ERROR] = why
    _publish(app, message, headers, "", queue, declare=[Queue(queue, durable=True)])


def _headers(message: Any) -> dict[str, Any]:
    headers = dict(message.headers or {})
    headers.pop("compression", None)  # the body was decompressed on receipt
    return headers


def _publish(
    app: Any,
    message: Any,
    headers: dict[str, Any],
    exchange: str,
    routing_key: str | None,
    declare: list[Queue] | None = None,
) -> None:
    with app.producer_or_acquire() as producer:
        publish_copy(producer, message, headers, exchange, routing_key, declare=declare, retry=True)


def publish_copy(
    producer: Any,
    message: Any,
    headers: dict[str, Any],
    exchange: str,
    routing_key: str | None,
    **options: Any,
) -> None:
    """Publish ``message``'s body as it is, with ``headers`` and its own properties."""
    props = message.properties or {}
    producer.publish(
        message.body,
        exchange=exchange,
        routing_key=routing_key,
        headers=headers,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        delivery_mode=props.get("delivery_mode"),
        priority=props.get("priority"),
        correlation_id=props.get("correlation_id"),
        reply_to=props.get("reply_to"),
        **options,
    )
