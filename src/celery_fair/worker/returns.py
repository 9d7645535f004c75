"""Messages the gate gives back to the broker: returned to their queue, or dead-lettered.

Both publish a copy first and acknowledge the original only once the broker has the copy
(``retry=True`` rides out a reconnect), so a crash in between leaves two copies, never none:
at least once (docs/operations.md#beyond-fair_max_held-spilling).
"""

from __future__ import annotations

from typing import Any

from kombu.entity import Queue

from .headers import ERROR, REPUBLISHED, SUBMITTED
from .internals import message_of

__all__ = ["dead_letter", "return_to_queue"]


def return_to_queue(app: Any, req: Any, arrival: float) -> None:
    """Publish ``req``'s message again to the exchange and routing key it came by, every header
    kept (``fair_submitted`` keeps its place in the fair order, ``fair_republished`` counts the
    trips), then acknowledge it.

    Raises:
        Exception: Whatever publishing raised; the original is then not acknowledged.
    """
    message = message_of(req)
    headers = _headers(message)
    headers.setdefault(SUBMITTED, arrival)
    headers[REPUBLISHED] = int(headers.get(REPUBLISHED) or 0) + 1
    info = message.delivery_info or {}
    _publish(app, message, headers, info.get("exchange") or "", info.get("routing_key"))
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
    props = message.properties or {}
    with app.producer_or_acquire() as producer:
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
            declare=declare,
            retry=True,
        )
