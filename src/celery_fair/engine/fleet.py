"""The fleet as this worker last heard of it from the store, its own share taken out.

The core decides as if its worker were alone, with what the others run counted against tier,
type and key caps (``Scheduler.set_running_elsewhere``). The store reports fleet-wide counts,
this worker's jobs included; the mirror keeps what the store counts as this worker's, so
that the rest, what runs elsewhere, is the difference.
"""

from __future__ import annotations

from ..core import Scheduler
from ..store.base import Ask

__all__ = ["FleetMirror"]


class FleetMirror:
    """Running counts: this worker's as the store sees them, and the fleet's as it said."""

    __slots__ = (
        "fleet_keys",
        "fleet_tenants",
        "keys_elsewhere",
        "mine_keys",
        "mine_tenants",
        "mine_tiers",
        "mine_types",
        "others_run",
        "types_else",
        "workers",
    )

    def __init__(self) -> None:
        # mine_tiers / mine_types / mine_keys: this worker's jobs that the store counts as
        # running, by priority, type and fairness key: those the engine marks ``in_store``,
        # plus the finished ones whose end the store has not heard of yet (``count``).
        self.mine_tiers: dict[int, int] = {}
        self.mine_types: dict[str, int] = {}
        self.mine_keys: dict[str, int] = {}
        # fleet_keys: running jobs per fairness key, fleet-wide, as the store last said, for
        # the keys with a cap or a minimum (what the core needs to know of other workers).
        self.fleet_keys: dict[str, int] = {}
        # mine_tenants / fleet_tenants: the same for tenants (two-level keys).
        self.mine_tenants: dict[str, int] = {}
        self.fleet_tenants: dict[str, int] = {}
        # workers: live workers as the store last said (this one included, at least 1).
        self.workers = 1
        # others_run: other workers run jobs (of any tier or type, as the store said);
        # keys_elsewhere: they run jobs of a key counted here.
        self.others_run = False
        self.keys_elsewhere = False
        # types_else: jobs other workers run, by type, as the store last said.
        self.types_else: dict[str, int] = {}

    def count(self, ask: Ask, n: int) -> None:
        """A job starts (1) or stops (-1) counting as running here in the store's eyes."""
        tiers = self.mine_tiers
        types = self.mine_types
        tiers[ask.priority] = tiers.get(ask.priority, 0) + n
        types[ask.type] = types.get(ask.type, 0) + n
        _add(self.mine_keys, ask.fairness_key, n)
        if ask.tenant is not None:
            _add(self.mine_tenants, ask.tenant, n)

    def mine(self) -> int:
        """How many running jobs the store should count under this worker."""
        return sum(self.mine_types.values())

    def see(
        self,
        core: Scheduler,
        tiers: dict[int, int],
        types: dict[str, int],
        workers: int,
        *,
        foreground: bool,
    ) -> None:
        """The fleet's running counts: what is not ours runs elsewhere; the core hears it."""
        self.workers = max(1, workers)
        mine_tiers = self.mine_tiers
        mine_types = self.mine_types
        tiers_else = {p: max(0, n - mine_tiers.get(p, 0)) for p, n in tiers.items()}
        types_else = self.types_else = {
            t: max(0, n - mine_types.get(t, 0)) for t, n in types.items()
        }
        mine_keys = self.mine_keys
        keys_else = {k: max(0, n - mine_keys.get(k, 0)) for k, n in self.fleet_keys.items()}
        mine_tenants = self.mine_tenants
        tenants_else = {
            t: max(0, n - mine_tenants.get(t, 0)) for t, n in self.fleet_tenants.items()
        }
        if foreground:
            # Propose its jobs to the store even when other workers fill a tier or type: a
            # refusal claims the next free slot (``Engine.foreground``), which no ask cannot.
            core.set_running_elsewhere({}, {}, keys_else, tenants=tenants_else)
        else:
            core.set_running_elsewhere(tiers_else, types_else, keys_else, tenants=tenants_else)
        self.others_run = any(n > 0 for n in tiers_else.values()) or any(
            n > 0 for n in types_else.values()
        )
        # A key (or tenant) held back by what other workers run of it learns of their ends
        # from a beat.
        self.keys_elsewhere = any(n > 0 for n in keys_else.values()) or any(
            n > 0 for n in tenants_else.values()
        )

    @staticmethod
    def see_conflicts(core: Scheduler, watched: list[tuple[str, str]], held: list[bool]) -> None:
        """Conflicts held elsewhere that the store says are free now: the core lets them go."""
        for ckey, is_held in zip(watched, held, strict=True):
            if not is_held:
                core.release_elsewhere(*ckey)


def _add(counts: dict[str, int], name: str, n: int) -> None:
    """``counts[name] += n``, an entry that falls to 0 dropped."""
    left = counts.get(name, 0) + n
    if left > 0:
        counts[name] = left
    else:
        counts.pop(name, None)
