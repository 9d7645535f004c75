"""Warnings once per episode: the first of a kind after a quiet spell, not one per message."""

from __future__ import annotations

__all__ = ["Episodes"]


class Episodes:
    """When each kind of event last happened, to log the first of each episode only.

    An episode of a kind starts with an event after ``quiet`` seconds (or ever) without one,
    and lasts while they keep coming closer together than that. O(1) per event; one entry per
    kind (the kinds are a small fixed set: header names).

    >>> e = Episodes(quiet=300)
    >>> [e.due("fair_priority", t) for t in (0, 1, 299, 700, 701)]
    [True, False, False, True, False]
    """

    __slots__ = ("_last", "quiet")

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self._last: dict[str, float] = {}

    def due(self, kind: str, now: float) -> bool:
        """Record an event of ``kind`` at ``now`` (monotonic seconds): whether it starts an
        episode (and so should be logged)."""
        last = self._last.get(kind)
        self._last[kind] = now
        return last is None or now - last >= self.quiet
