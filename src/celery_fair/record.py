"""Live traffic into a simulator trace: ``celery -A app fair record --out trace.json``.

Fair workers' task events carry each job's type, key, job id and submission time
(worker/events.py). A ``Recorder`` is fed those events as they come and builds the trace format
of docs/simulator.md: one job per fair task that arrived and ended during the recording, its
``arrival`` the time it was published (its ``fair_submitted`` header; the time a worker received
it only for a job published without one), in seconds from the first arrival, its ``duration``
the time it ran. A burst is a burst in the trace, not the pace at which workers took it from the
broker. It is also fed the fleet's runtime policies as they change (``policies``), and the trace
carries the policies in force: the key policies (``fair_keys`` with the runtime ones on top),
the pauses while they lasted, the tier caps, aging, alpha, allocation caps and cost lifecycle
(``settings_config``). So a real day of traffic can be replayed against another configuration.
Pure: it reads dicts and settings, it does no I/O.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

from .core import JobType, KeyPolicies, KeyPolicy
from .core.types import KEY_OPTIONS

__all__ = ["Recorder", "key_policies_spec", "parse_duration", "settings_config"]


@dataclass
class _Seen:
    type: str
    fairness_key: str
    job_id: str | None
    received: float
    submitted: float | None = None
    started: float | None = None
    duration: float | None = None

    @property
    def arrival(self) -> float:
        """When it was published; never after a worker received it (two clocks)."""
        if self.submitted is None:
            return self.received
        return min(self.submitted, self.received)


class Recorder:
    """Builds a trace from task events (``celery.events`` dicts, any order within a task)."""

    def __init__(self) -> None:
        self._jobs: dict[str, _Seen] = {}
        self.ignored = 0  # events of tasks that are not fair jobs
        self._keys: dict[str, dict[str, Any]] | None = None  # runtime key policies, first seen
        # ("key" | "type", name) -> [at, until or None], in the order the pauses began
        self._pauses: list[tuple[str, str, list[float | None]]] = []
        self._open: dict[tuple[str, str], list[float | None]] = {}

    def policies(self, at: float, runtime: dict[str, Any]) -> None:
        """The fleet's runtime policies seen at ``at`` (epoch seconds): ``policies.describe``'s
        dict. The first call's key policies go into the trace; pauses that begin or end
        between calls are recorded as beginning or ending at the call that saw it."""
        if self._keys is None:
            self._keys = {name: dict(opts) for name, opts in runtime.get("keys", {}).items()}
        now_paused = {("key", k) for k in runtime.get("paused_keys", ())}
        now_paused |= {("type", t) for t in runtime.get("paused_types", ())}
        now_paused |= {("tenant", t) for t in runtime.get("paused_tenants", ())}
        for name in list(self._open):
            if name not in now_paused:
                self._open.pop(name)[1] = at
        for name in sorted(now_paused - set(self._open)):
            span: list[float | None] = [at, None]
            self._open[name] = span
            self._pauses.append((*name, span))

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
        submitted = event.get("submitted")
        if seen.submitted is None and _finite(submitted):
            seen.submitted = float(submitted)
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

    def trace(
        self,
        types: dict[str, JobType],
        capacity: int,
        config: dict[str, Any] | None = None,
        keys: KeyPolicies | None = None,
    ) -> dict[str, Any]:
        """The trace: the recorded jobs of the types in ``types`` (the app's), in arrival
        order, under ``config`` (``settings_config``: top-level fields of the trace), the key
        policies ``keys`` (``fair_keys``) with the runtime ones seen first on top, and the
        pauses seen (from the first arrival on; one still on at the end has no ``until``)."""
        done = sorted(
            (s for s in self._jobs.values() if s.duration is not None and s.type in types),
            key=lambda s: s.arrival,
        )
        origin = done[0].arrival if done else 0.0
        used = {s.type for s in done}
        out: dict[str, Any] = {"capacity": capacity, **(config or {})}
        spec = key_policies_spec(keys or KeyPolicies())
        spec.update(self._keys or {})
        if spec:
            out["keys"] = spec
        pauses = self._pauses_from(origin, used)
        if pauses:
            out["pauses"] = pauses
        return {
            **out,
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
                    **({"aging": asdict(t.aging)} if t.aging is not None else {}),
                    **(
                        {"rate": t.rate, "burst": t.bucket, "per": t.per}
                        if t.rate is not None
                        else {}
                    ),
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
                    "arrival": round(s.arrival - origin, 6),
                    "duration": round(s.duration or 0.0, 6),
                }
                for i, s in enumerate(done)
            ],
        }

    def _pauses_from(self, origin: float, types: set[str]) -> list[dict[str, Any]]:
        out = []
        for kind, name, (at, until) in self._pauses:
            assert at is not None
            if until is not None and until <= origin:
                continue  # over before the first arrival
            if kind == "type" and name not in types:
                continue  # a type none of the trace's jobs has: the trace cannot name it
            pause: dict[str, Any] = {kind: name, "at": round(max(0.0, at - origin), 6)}
            if until is not None:
                pause["until"] = round(until - origin, 6)
            out.append(pause)
        return out


def key_policies_spec(keys: KeyPolicies) -> dict[str, dict[str, Any]]:
    """``keys`` as the mapping ``fair_keys`` and a trace's ``keys`` take (``"*"`` for the
    default when it is not the built-in one), each policy without its default values."""
    spec = {name: _policy_spec(p) for name, p in keys.exact.items()}
    spec.update((name, _policy_spec(p)) for name, p in keys.patterns)
    if keys.default != KeyPolicies().default:
        spec["*"] = _policy_spec(keys.default)
    return spec


def _policy_spec(policy: KeyPolicy) -> dict[str, Any]:
    plain = KeyPolicy()
    return {
        name: getattr(policy, name)
        for name in KEY_OPTIONS
        if getattr(policy, name) != getattr(plain, name)
    }


def settings_config(settings: Any) -> dict[str, Any]:
    """The trace's top-level fields for what ``settings`` (``FairSettings``) sets that the
    simulator models: tier caps, aging, alpha, allocation caps, the priority scope, the key
    separator and the cost lifecycle."""
    out: dict[str, Any] = {"alpha": settings.alpha}
    if settings.tier_caps:
        out["tier_caps"] = {str(p): cap for p, cap in sorted(settings.tier_caps.items())}
    if settings.aging is not None:
        out["aging"] = asdict(settings.aging)
    if settings.allocation_caps:
        out["allocation_caps"] = True
    if settings.priority_scope != "global":
        out["priority_scope"] = settings.priority_scope
    if settings.key_separator is not None:
        out["key_separator"] = settings.key_separator
    out["lifecycle"] = asdict(settings.lifecycle)
    return out


def _finite(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
