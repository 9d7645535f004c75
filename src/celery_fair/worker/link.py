"""Store calls on the worker's event loop that never block it.

The same trick as Kombu's Redis transport for BRPOP: send the command on a connection of our
own, register its socket with the hub, and read the reply when the socket is readable. The
loop goes on with the broker and the pool meanwhile, no thread contends for the GIL, and
whatever happens while a call is in flight rides on the next one. redis-py opens the
connection (TLS, AUTH, SELECT); after that, commands are packed and replies parsed by hiredis
directly on the socket (``store.connection.Wire``, which the blocking calls use too).

A call that gets no answer within ``timeout`` seconds fails as ``StoreUnavailable``, and so
does every connection error; the engine then degrades as configured. A script that Redis
forgot (a restart, ``SCRIPT FLUSH``) is sent again in full (``NOSCRIPT``).
"""

from __future__ import annotations

import select
from collections.abc import Callable
from typing import Any

import hiredis
from celery.utils.log import get_logger

from ..engine import Call
from ..errors import StoreUnavailable
from ..store.connection import Wire, script_reply_error
from ..store.redis import RedisStore, Request

__all__ = ["StoreLink"]

logger = get_logger(__name__)


class StoreLink:
    """One store call at a time over a connection the hub watches.

    Args:
        store: A ``RedisStore`` on a plain ``redis.Redis`` client (not a cluster).
        hub: The worker's event loop (Kombu's ``Hub``).
        deliver: Called on the loop with each call and its reply, or the exception it met.
        timeout: Seconds to wait for a reply.
    """

    def __init__(
        self,
        store: RedisStore,
        hub: Any,
        deliver: Callable[[Call, Any], None],
        timeout: float = 5.0,
    ) -> None:
        self.store = store
        self.hub = hub
        self.deliver = deliver
        self.timeout = timeout
        assert StoreLink.supports(store), "the link drives one Redis server, not a cluster"
        self._wire = Wire(store.client)  # type: ignore[arg-type]
        self._fd: int | None = None
        self._pending: tuple[Call, Request, bool] | None = None
        self._deadline: Any = None

    @staticmethod
    def supports(store: object) -> bool:
        """Whether ``store`` can be driven this way (a ``RedisStore`` on one Redis server)."""
        if not isinstance(store, RedisStore):
            return False
        import redis

        return type(store.client) is redis.Redis

    def submit(self, call: Call) -> None:
        """Send ``call``; its reply is delivered later, on the loop."""
        request = call.request(self.store)
        try:
            self._send(request, full=False)
        except Exception as exc:
            self._drop_connection()
            self.hub.call_soon(self.deliver, call, _unavailable(exc))
            return
        self._pending = (call, request, False)
        self._deadline = self.hub.call_later(self.timeout, self._on_timeout, call)

    def close(self) -> None:
        """Forget the call in flight, if any, and the connection."""
        self._pending = None
        self._cancel_deadline()
        self._drop_connection()

    # -- internals -----------------------------------------------------------------------

    def _send(self, request: Request, *, full: bool) -> None:
        wire = self._wire
        if self._fd is None:
            self._fd = wire.open()
            self.hub.add_reader(self._fd, self._on_readable)
        keys = self.store.keys
        sha, source = self.store.script(request.script)
        head = ("EVAL", source) if full else ("EVALSHA", sha)
        wire.send((*head, len(keys), *keys, *request.args))

    def _on_readable(self, *_: Any) -> None:
        pending = self._pending
        if self._fd is None:
            return
        try:
            raw = self._wire.feed()
        except Exception as exc:
            self._drop_connection()
            if pending is not None:
                self._finish(pending[0], _unavailable(exc))
            return
        if raw is False:
            return  # the rest of the reply is still on its way
        if pending is None:  # nothing was asked: not ours to read
            self._drop_connection()
            return
        call, request, resent = pending
        if isinstance(raw, hiredis.ReplyError):
            if str(raw).startswith("NOSCRIPT") and not resent:
                try:  # Redis forgot the script (a restart, SCRIPT FLUSH): send it in full
                    self._send(request, full=True)
                except Exception as exc:
                    self._drop_connection()
                    self._finish(call, _unavailable(exc))
                    return
                self._pending = (call, request, True)
                return
            error = script_reply_error(str(raw))
            if isinstance(error, StoreUnavailable):
                self._drop_connection()  # e.g. READONLY from a master turned replica
            self._finish(call, error)
            return
        try:
            result = self.store.parse(request, raw)
        except Exception as exc:
            result = exc
        self._finish(call, result)

    def _finish(self, call: Call, result: Any) -> None:
        self._pending = None
        self._cancel_deadline()
        self.deliver(call, result)

    def _on_timeout(self, call: Call) -> None:
        pending = self._pending
        if pending is None or pending[0] is not call:
            return
        self._deadline = None
        if self._fd is not None and _readable(self._fd):
            # The answer is there but the loop has not polled since it came: it is busy
            # elsewhere while its timers still fire (Celery joins the pool at shutdown with
            # a thread firing them). Take the answer rather than call the store unreachable.
            self._on_readable()
            if self._pending is None or self._pending[0] is not call:
                return
        self._drop_connection()  # a late reply must not be taken for the next call's
        self._pending = None
        self.deliver(call, StoreUnavailable(f"the store did not answer within {self.timeout}s"))

    def _cancel_deadline(self) -> None:
        deadline, self._deadline = self._deadline, None
        if deadline is not None:
            deadline.cancel()

    def _drop_connection(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self.hub.remove_reader(fd)
            except Exception:  # already gone with a closed loop
                logger.debug("celery-fair: could not unregister the store's socket.")
        self._wire.close()


def _readable(fd: int) -> bool:
    """Whether reading ``fd`` now would not block (``poll``: no limit on the fd's number)."""
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            return bool(poller.poll(0))
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return False


def _unavailable(exc: BaseException) -> StoreUnavailable:
    if isinstance(exc, StoreUnavailable):
        return exc
    error = StoreUnavailable(f"Redis store unreachable: {exc}")
    error.__cause__ = exc
    return error
