"""A decision booked for when time alone changes one: a key out of its rate refills, a held job
ages a level (``Scheduler.next_rise``).

The gate decides when jobs come and go, and on its sweep and store polls; a rate of 5 a second
cannot wait for those (its starts would come a poll apart, not a fifth of a second). So after
each decision the gate books one entry on the worker's timer for the core's next change, and
moves it only when that change comes earlier: one entry at a time, none while nothing is due,
and no loop that looks for work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Wake"]


class Wake:
    """One booked call of ``decide`` at the core's next change by time. ``timer`` is Celery's
    (Kombu's ``Timer``: ``call_after``), set when the consumer starts; ``None``: none yet."""

    def __init__(self, decide: Callable[[], None]) -> None:
        self._decide = decide
        self.timer: Any = None
        self._entry: Any = None
        self._due = float("inf")

    def book(self, due: float | None, now: float) -> None:
        """Decide again at ``due`` (by the clock that gave ``now``), unless a call as early is
        booked. A change already due is the decision in progress's to see: nothing. O(log
        entries) on the timer."""
        if due is None or due <= now or self.timer is None:
            return
        entry = self._entry
        if entry is not None:
            if self._due <= due:
                return
            self.timer.cancel(entry)  # the timer's own (a green timer's entry is a greenlet)
        self._due = due
        self._entry = self.timer.call_after(due - now, self._fire)

    def _fire(self) -> None:
        self._entry = None
        self._due = float("inf")
        self._decide()

    def cancel(self) -> None:
        """Drop the booked call (the consumer stops)."""
        if self._entry is not None:
            if self.timer is not None:
                self.timer.cancel(self._entry)
            self._entry = None
            self._due = float("inf")
