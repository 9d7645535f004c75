"""Each fairness key's service across the fleet, from one ``RedisStore.inspect()`` document.

Pure (no I/O): Flower's fleet metrics (flower.py) and ``celery -A app fair status``
(commands.py) read the same numbers from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["KeyService", "Service", "jain_index", "service"]


@dataclass(frozen=True)
class KeyService:
    """One key's running jobs, accumulated cost, lag behind the fair share, and share of the
    service the running keys have received (``1/n`` each when it is fair)."""

    key: str
    running: int
    cost: float
    lag: float
    share: float


@dataclass(frozen=True)
class Service:
    """The top keys by running jobs (then cost, then name), the rest summed, and Jain's index.

    With equal weights the fair share is the mean accumulated cost of the keys that run now; a
    key's lag is how far below it the key is (positive: owed service, it goes first), in seconds
    of work.
    """

    top: list[KeyService]
    other_keys: int
    other_running: int
    jain_index: float


def service(state: dict[str, Any], top: int) -> Service:
    running: dict[str, int] = {}
    for job in state["jobs"]:
        running[job["fairness_key"]] = running.get(job["fairness_key"], 0) + 1
    costs = {k: float(v) for k, v in state["costs"].items()}
    active = [costs.get(k, 0.0) for k in running]
    total = math.fsum(active)
    mean = total / len(active) if active else 0.0

    def share(cost: float) -> float:
        return cost / total if total else 1.0 / len(active)

    ranked = sorted(running, key=lambda k: (-running[k], -costs.get(k, 0.0), k))
    named = [
        KeyService(k, running[k], c, mean - c, share(c))
        for k in ranked[:top]
        for c in (costs.get(k, 0.0),)
    ]
    rest = ranked[top:]
    return Service(named, len(rest), sum(running[k] for k in rest), jain_index(active))


def jain_index(values: list[float]) -> float:
    """Jain's fairness index, (sum x)^2 / (n * sum x^2); 1.0 for no values or all zero."""
    squares = math.fsum(v * v for v in values)
    if not values or squares == 0:
        return 1.0
    return math.fsum(values) ** 2 / (len(values) * squares)
