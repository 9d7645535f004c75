"""Clocks: the only way time enters the scheduling core."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "MonotonicClock", "SimClock", "WallClock"]


@runtime_checkable
class Clock(Protocol):
    """A source of the current time in float seconds.

    The core reads time only through this protocol, so the worker, the simulator and the
    tests run the same code with different clocks.
    """

    def now(self) -> float:
        """Return the current time in seconds."""
        ...


class WallClock:
    """Seconds since the Unix epoch, as producers stamp their messages.

    Arrival times come from message headers written on other machines, so the worker must
    compare them with a clock of the same base; a monotonic clock would not do.
    """

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class MonotonicClock:
    """Seconds from an arbitrary start that never go back: for intervals and deadlines."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()


class SimClock:
    """A clock that starts at ``start`` and moves only when told to.

    Example:
        >>> clock = SimClock()
        >>> clock.advance(2.5)
        >>> clock.now()
        2.5
    """

    __slots__ = ("_now",)

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def set(self, t: float) -> None:
        """Move to time ``t``; time never goes backwards."""
        if t < self._now:
            raise ValueError(f"SimClock cannot go back from {self._now} to {t}")
        self._now = t

    def advance(self, dt: float) -> None:
        """Move forward by ``dt`` seconds (``dt >= 0``)."""
        if dt < 0:
            raise ValueError(f"SimClock cannot advance by a negative amount ({dt})")
        self._now += dt
