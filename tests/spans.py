"""Time spans recorded by tests (a job's start and end), shared by unit and integration tests."""

from __future__ import annotations


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The largest number of intervals that were open at one instant."""
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    best = now = 0
    for _, step in points:
        now += step
        best = max(best, now)
    return best
