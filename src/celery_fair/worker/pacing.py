"""When a gate's store calls are made, with a store link on the worker's event loop.

The gate notes that something changed (``note``); once per turn of the loop, before it polls,
one store call is made for all that changed during the turn (``tick``), through the engine's
driver loop, sent by the store link (link.py) without blocking the loop, and its reply acted on
when it arrives (``answered``). Two refinements:

- *Let the job go first.* A job Celery has just handed to the prefork pool is written to its
  process only after this turn's poll; the store call, which wakes Redis and may yield the CPU
  to it, waits one turn so the job goes first.
- *Gather.* While the pool's line (reserved jobs and jobs handed over but not yet started) is
  deeper than the reserve's refill mark, the pool stays busy anyway: events gather for up to
  ``GATHER_SECONDS``, and one call then reports several finished jobs and admits as many.

While a call is in flight there is nothing to decide: its reply decides again. Without a link
(no event loop, or a store the link cannot drive) the gate decides inline and none of this
applies. Runs on the loop thread; ``step`` takes the gate's lock, given at construction.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from ..engine import LATER, Call, Decision, Driver, Engine
from ..store.redis import RedisStore
from .link import StoreLink

__all__ = ["GATHER_SECONDS", "StorePacing"]

#: Longest a store call waits for more events to share it while the pool's line is deep.
GATHER_SECONDS = 0.02


class StorePacing:
    """The gate's store calls on the event loop (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        act: Callable[[Decision], None],
        *,
        lock: AbstractContextManager[Any],
        line: Callable[[], int],
        refill_mark: Callable[[], int],
        writes_pending: Callable[[], bool],
    ) -> None:
        """``act`` starts what a decision admits; ``line`` is how many jobs wait for the pool
        (reserved, or handed over and not started), ``refill_mark`` how few are worth a call at
        once (0: always), ``writes_pending`` whether the pool has jobs not yet written to its
        processes."""
        self.engine = engine
        self._loop = Driver(engine, act, execute=self._send)
        self._lock = lock
        self._line = line
        self._refill_mark = refill_mark
        self._writes_pending = writes_pending
        self._link: StoreLink | None = None
        self._hub: Any = None
        self._dirty = False  # something changed since the last call was planned
        self._gather_timer: Any = None
        self._yielded = False  # the last turn let a job be written first

    @property
    def linked(self) -> bool:
        """Whether calls go through the store link (else the gate decides inline)."""
        return self._link is not None

    @property
    def due(self) -> bool:
        """A decision is due (something changed since the last call was planned)."""
        return self._dirty

    def start(self, hub: Any, on_reply: Callable[[Call, Any], None]) -> None:
        """With an event loop ``hub``, make store calls on it; replies go to ``on_reply``.
        Nothing happens without a hub, with a link already, or with a store the link cannot
        drive (Redis Cluster): calls are then made inline."""
        store = self.engine.store
        if self._link is not None or hub is None or not StoreLink.supports(store):
            return
        assert isinstance(store, RedisStore)
        self._link = StoreLink(store, hub, on_reply)
        self._hub = hub
        hub.on_tick.add(self.tick)
        self._dirty = True

    def note(self) -> None:
        """Something changed: the next turn decides."""
        self._dirty = True

    def answered(self, call: Call, result: Any) -> None:
        """A call came back: apply it (the caller holds the gate's lock)."""
        self._loop.answered(call, result)

    def tick(self) -> None:
        """Once per turn of the event loop, before it polls: the call this turn needs."""
        if not self._dirty or self._gathering() or self.engine.busy:
            return
        if not self._yielded and self._writes_pending():
            self._yielded = True
            return
        self._yielded = False
        self._step()

    def _gathering(self) -> bool:
        mark = self._refill_mark()
        if mark and self._line() > mark:
            if self._gather_timer is None:
                self._gather_timer = self._hub.call_later(GATHER_SECONDS, self._gather_over)
            return True
        self._cancel_gather()
        return False

    def _cancel_gather(self) -> None:
        if self._gather_timer is not None:
            self._gather_timer.cancel()
            self._gather_timer = None

    def _gather_over(self) -> None:
        self._gather_timer = None
        if self._dirty:
            self._step()

    def _step(self) -> None:
        with self._lock:
            self._dirty = False
            if self._link is not None:
                self._loop.step()

    def _send(self, call: Call) -> Any:
        assert self._link is not None
        self._link.submit(call)
        return LATER

    def close(self) -> None:
        """Stop: a call in flight is abandoned (its admissions are released when the worker's
        lease expires); later calls are made inline."""
        link, self._link = self._link, None
        self._cancel_gather()
        if link is not None:
            link.close()
            self._hub.on_tick.discard(self.tick)
