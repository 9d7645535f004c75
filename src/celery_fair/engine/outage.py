"""While the store is unreachable: the probe's backoff, and local mode's share of each cap.

``hold`` admits nothing new. ``local`` admits on this worker's own share of each cap,
``ceil(cap / live workers)`` (the number of live workers as the store last reported it), and
never a job with a conflict, since exclusion needs the store: each such job's conflict is held
"elsewhere" in the core until the store answers again. Jobs admitted locally get tokens above
every token the store gave here, and are registered with the store once it answers (the
register sync, modes.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..core import Scheduler

__all__ = ["OUTAGE_POLICIES", "Outage", "local_shares"]

#: What a worker may do while the store is unreachable (``fair_store_outage``).
OUTAGE_POLICIES = ("hold", "local")

#: The probe's backoff: doubled at every failure, within these bounds (seconds).
BACKOFF_MIN = 0.5
BACKOFF_MAX = 10.0


def local_shares(
    core: Scheduler, workers: int, priorities: Iterable[int]
) -> tuple[dict[int, int], dict[str, int], dict[str, int]]:
    """What local mode counts as running elsewhere, per tier, type and key, so that this
    worker's share of each cap, ``ceil(cap / workers)``, is what is left to it."""
    tiers: dict[int, int] = {}
    for priority in set(priorities) | {t.priority for t in core.types.values()}:
        cap = core.config.tier_cap(priority)
        if cap is not None:
            tiers[priority] = cap - math.ceil(cap / workers)
    types: dict[str, int] = {}
    for jtype in core.types.values():
        if jtype.max_concurrency is not None:
            types[jtype.name] = jtype.max_concurrency - math.ceil(jtype.max_concurrency / workers)
    keys = {k: cap - math.ceil(cap / workers) for k, cap in core.key_limits().items()}
    return tiers, types, keys


def local_tenant_shares(core: Scheduler, workers: int) -> dict[str, int]:
    """As ``local_shares``, per tenant with a cap (two-level keys)."""
    return {t: cap - math.ceil(cap / workers) for t, cap in core.tenant_limits().items()}


class Outage:
    """The engine's bookkeeping for outages: the backoff, local holds, local tokens."""

    __slots__ = ("backoff", "holds", "tokens")

    def __init__(self) -> None:
        self.backoff = 0.0  # seconds until the next probe; 0 while the store answers
        # holds: conflicts held "elsewhere" in the core only because local mode cannot check
        # them; let go when the store answers again.
        self.holds: set[tuple[str, str]] = set()
        self.tokens = 0  # tokens given locally so far, counted above the store's highest

    def failed(self) -> float:
        """A call failed: the seconds to wait before the next one."""
        self.backoff = min(BACKOFF_MAX, max(BACKOFF_MIN, self.backoff * 2))
        return self.backoff

    def enter_local(self, core: Scheduler, workers: int, priorities: Iterable[int]) -> None:
        """This worker's share of every cap is what the core may fill from now on."""
        tiers, types, keys = local_shares(core, workers, priorities)
        tenants = local_tenant_shares(core, workers)
        core.set_running_elsewhere(tiers, types, keys, urgent_passes=False, tenants=tenants)

    def hold(self, core: Scheduler, group: str, job_id: str | None) -> None:
        """A job with a conflict waits in local mode: its conflict counts as held elsewhere."""
        if group and job_id is not None:
            ckey = (group, job_id)
            core.hold_elsewhere(*ckey)
            self.holds.add(ckey)

    def token(self, highest: int) -> int:
        """A token for a job admitted locally, above ``highest`` the store gave."""
        self.tokens += 1
        return highest + self.tokens

    def answered(self, core: Scheduler) -> None:
        """The store answers again: the local holds go (the store checks conflicts again)."""
        for ckey in self.holds:
            core.release_elsewhere(*ckey)
        self.holds.clear()
