"""How deep a worker's reserve is: admitted jobs kept ready ahead of its free pool processes.

A worker that shares a store admits a few jobs before a pool process is free, so that the
store's round trip is hidden behind work already running (the gate's *reserve*). A reserved job
holds its tier and type slot and its conflict fleet-wide while it waits, so the reserve should
be as deep as it needs to be and no deeper: deep for jobs that last a millisecond (one store
call then admits several, and the pool never waits for Redis), one job for jobs that last a
minute (a second one would hold its slot for about a minute without running).

``ReserveDepth`` sizes it by time: the reserve covers about ``window`` seconds of the pool's
work. With ``slots`` processes and jobs that last ``mean`` seconds on average, a process frees
every ``mean / slots`` seconds, so ``window * slots / mean`` jobs cover the window, bounded by
``minimum`` and ``maximum``. The mean is an exponential moving average of the wall times the
worker observes (every fair job, whatever its type), starting from no knowledge: until a job
has been timed, the depth is ``minimum``. A job in the reserve thus waits, on average, no longer
than ``window`` before it starts.

Pure: no clock, no I/O; the gate feeds it the wall times it measures.
"""

from __future__ import annotations

import math

__all__ = ["ReserveDepth"]


class ReserveDepth:
    """The reserve's depth for the jobs this worker has been running lately.

    Example:
        >>> sizer = ReserveDepth(window=0.01, minimum=1, maximum=8)
        >>> sizer.depth(slots=2)            # nothing timed yet
        1
        >>> sizer.observe(0.001)            # 1 ms jobs: 2 processes free 20 slots in 10 ms
        >>> sizer.depth(slots=2)
        8
        >>> for _ in range(60): sizer.observe(1.0)
        >>> sizer.depth(slots=2)            # 1 s jobs: one ahead is plenty
        1
    """

    __slots__ = ("alpha", "maximum", "mean", "minimum", "window")

    def __init__(
        self, window: float, *, minimum: int = 1, maximum: int = 8, alpha: float = 0.2
    ) -> None:
        if not window > 0 or not math.isfinite(window):
            raise ValueError(f"window must be a positive number of seconds, not {window!r}")
        if not 0 <= minimum <= maximum:
            raise ValueError(f"need 0 <= minimum <= maximum, not {minimum} and {maximum}")
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], not {alpha!r}")
        self.window = float(window)
        self.minimum = minimum
        self.maximum = maximum
        self.alpha = alpha
        self.mean: float | None = None  # seconds a job lasts, on average; None: none timed

    def observe(self, elapsed: float) -> None:
        """Fold one job's wall time (seconds) into the mean. Negative or NaN is ignored."""
        if not elapsed >= 0 or math.isinf(elapsed):
            return
        mean = self.mean
        self.mean = elapsed if mean is None else mean + self.alpha * (elapsed - mean)

    def depth(self, slots: int) -> int:
        """Jobs to keep admitted ahead of ``slots`` pool processes."""
        mean = self.mean
        if mean is None or slots <= 0:
            return self.minimum
        work = self.window * slots  # process-seconds the reserve should cover
        if work >= self.maximum * mean:  # also a mean of 0 (or so small the ratio overflows)
            return self.maximum
        wanted = math.ceil(work / mean - 1e-9)
        return max(self.minimum, wanted)
