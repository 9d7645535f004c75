"""The one loop that drives an engine: decide, make the store call, apply what came back.

Three callers drive an engine, each in its own way of waiting: ``Engine.run_inline`` (a store
in this process, or a loop that may block), the slot scheduler's thread (slots.py) and the
worker's store link, whose reply comes back later on the event loop (worker/link.py). They
differ only in how a call is made and in what they do with a decision; the round is this one:

1. ``engine.decide()``, and ``act`` on the decision (jobs to start, copies to drop);
2. if the decision holds a call, ``execute`` it: inline, where an exception is its outcome, or
   by handing it to a link, which returns ``LATER`` and delivers the outcome to ``answered``;
3. ``answered``: ``engine.apply(call, outcome)``, and ``act`` on that decision too.

``turn`` repeats rounds until a decision holds no call (while a call is in flight the engine
decides nothing, so a turn after a hand-off ends at once).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .calls import Call, Decision

if TYPE_CHECKING:
    from .engine import Engine

__all__ = ["LATER", "Driver"]


class _Later(enum.Enum):
    LATER = "the reply comes later, through Driver.answered"


#: What ``execute`` returns when it only sent the call.
LATER = _Later.LATER


class Driver:
    """Rounds of decide, execute, apply over one engine (see the module docstring).

    Args:
        engine: The engine to drive.
        act: Does what a decision says; runs under ``lock``.
        execute: Makes a call and returns its reply, the exception it raised, or ``LATER``;
            by default the call is made here, on the engine's store.
        lock: Held while the engine decides or applies, and while ``act`` runs.
        settle: Runs after each ``act``, outside ``lock`` (to wake whoever waits, say).
    """

    __slots__ = ("act", "engine", "execute", "lock", "settle")

    def __init__(
        self,
        engine: Engine,
        act: Callable[[Decision], None],
        *,
        execute: Callable[[Call], Any] | None = None,
        lock: AbstractContextManager[Any] | None = None,
        settle: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.act = act
        self.execute = execute if execute is not None else self.inline
        self.lock = lock
        self.settle = settle

    def turn(self) -> None:
        """Rounds until nothing is left to do now."""
        while self.step() is not None:
            pass

    def step(self) -> Call | None:
        """One round; returns the call it made (or handed on), ``None`` if there was none."""
        lock = self.lock
        if lock is None:  # the common case, on the worker's hot path: no context manager
            decision = self.engine.decide()
            self.act(decision)
        else:
            with lock:
                decision = self.engine.decide()
                self.act(decision)
        if self.settle is not None:
            self.settle()
        call = decision.call
        if call is not None:
            outcome = self.execute(call)
            if outcome is not LATER:
                self.answered(call, outcome)
        return call

    def answered(self, call: Call, outcome: Any) -> None:
        """``call`` came back with ``outcome`` (its reply, or the exception it raised)."""
        lock = self.lock
        if lock is None:
            self.act(self.engine.apply(call, outcome))
        else:
            with lock:
                self.act(self.engine.apply(call, outcome))
        if self.settle is not None:
            self.settle()

    def inline(self, call: Call) -> Any:
        """Make ``call`` here on the engine's store; an exception is its outcome."""
        try:
            return call.execute(self.engine.store)  # type: ignore[arg-type]
        except Exception as exc:  # every failure is the engine's to handle
            return exc
