"""Live traffic into a simulator trace: ``celery -A app fair record --out trace.json``.

Fair workers' task events carry each job's type, key and job id (worker/events.py). A
``Recorder`` is fed those events as they come and builds the trace format of docs/simulator.md:
one job per fair task that arrived and ended during the recording, its ``arrival`` the time it
was received (seconds from the first arrival), its ``duration`` the time it ran. So a real day
of traffic can be replayed against another configuration. Pure: it reads dicts, it does no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .core import JobType

__all__ = ["Recorder", "parse_duration"]


@dataclass
class _Seen:
    type: str
    fairness_key: str
    job_id: str | None
    received: float
    started: float | None = None
    duration: float | None = None


class Recorder:
    """Builds a trace from task events (``celery.events`` dicts, any order within a task)."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Seen] = {}
        self.ignored = 0  # events of tasks that are not fair jobs

    def event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        uuid = event.get("uuid")
        if uuid is None or not kind.startswith("task-"):
            return
        seen = self._jobs.get(uuid)
        if seen is None:
            job_type = event.get("job_type")
            if kind not in ("task-received", "task-started") or not isinstance(job_type, str):
                self.ignored += kind == "task-received"
                return
            key = event.get("fairness_key")
            job_id = event.get("job_id")
            seen = self._jobs[uuid] = _Seen(
                job_type,
                key if isinstance(key, str) else "",
                job_id if isinstance(job_id, str) else None,
                float(event["timestamp"]),
            )
        if kind == "task-started":
            seen.started = float(event["timestamp"])
        elif kind == "task-succeeded" and isinstance(event.get("runtime"), (int, float)):
            seen.duration = float(event["runtime"])
        elif kind in ("task-failed", "task-succeeded") and seen.started is not None:
            seen.duration = max(0.0, float(event["timestamp"]) - seen.started)

    @property
    def unfinished(self) -> int:
        """Fair jobs seen arriving that had not ended (they are left out of the trace)."""
        return sum(1 for s in self._jobs.values() if s.duration is None)

    def trace(self, types: dict[str, JobType], capacity: int) -> dict[str, Any]:
        """The trace: the recorded jobs of the types in ``types`` (the app's), in arrival order."""
        done = sorted(
            (s for s in self._jobs.values() if s.duration is not None and s.type in types),
            key=lambda s: s.received,
        )
        origin = done[0].received if done else 0.0
        used = {s.type for s in done}
        return {
            "capacity": capacity,
            "types": {
                name: {
                    "priority": t.priority,
                    **(
                        {"max_concurrency": t.max_concurrency}
                        if t.max_concurrency is not None
                        else {}
                    ),
                    **({"conflict_group": t.conflict_group} if t.conflict_group else {}),
                    "default_cost": t.default_cost,
                }
                for name, t in sorted(types.items())
                if name in used
            },
            "jobs": [
                {
                    "name": f"{s.type}:{i}",
                    "type": s.type,
                    "job_id": s.job_id,
                    "fairness_key": s.fairness_key,
                    "arrival": round(s.received - origin, 6),
                    "duration": round(s.duration or 0.0, 6),
                }
                for i, s in enumerate(done)
            ],
        }


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"10m"``, ``"1.5h"`` as seconds (> 0).

    >>> parse_duration("10m"), parse_duration("1.5h"), parse_duration("45")
    (600.0, 5400.0, 45.0)
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise ValueError(f"expected a duration such as 90s, 10m or 1h, got {text!r}")
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]
