"""What the gate reads of Celery's and Kombu's insides that is not their public API.

Each helper names the internal it relies on. Checked against celery 5.7.0, kombu 5.7.0 and
billiard 4.3.2 (the versions ``tests/unit/test_internals.py`` runs on); each degrades to a safe
answer when the internal is missing, as the docstrings say.
"""

from __future__ import annotations

from typing import Any

from celery.utils.log import get_logger

__all__ = ["ack_quietly", "already_revoked", "request_of", "writes_pending"]

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
