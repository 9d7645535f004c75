"""How many slots each fairness key would get: the slot-allocation view of weights.

The dispatch rule itself never allocates slots: it orders jobs (by rank, then by cost charged
``estimate / weight``), and that order gives each backlogged key its weighted share over time
while no slot ever idles for a key that has no work. This module answers the question an
operator asks of it instead: with these keys waiting, who gets how many of the slots? It is
computed when the set of keys with work or their policies change, never per decision, and it
feeds metrics and ``inspect``, and with ``SchedulerConfig.allocation_caps`` it is each key's
soft cap (see ``Scheduler``: a key at its allocation yields to keys below theirs).

The allocation, in the order seed 001 gives it:

1. every key gets its ``min_slots`` (no more than it can use);
2. the slots left are shared by weight among the keys that can use more, each share clamped
   to what the key can use: its cap (``max_concurrency``) and its demand (running plus
   pending jobs); what a clamped key cannot use goes to the others, by weight, until nobody
   can use more (water-filling);
3. the shares are made whole: each key gets the whole part of its share, and the slots left
   over go one each to the largest fractional parts, ties to the key with fewer slots so far,
   then to the earlier name.

Slots nobody can use stay idle (``Allocation.idle``).

With two-level keys (``core/tenants.py``) the same rule runs twice (``two_levels``): the
tenants share the slots, each tenant's demand being what its keys can use together (each key's
demand no more than its own cap); then each tenant's whole slots are shared among its keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

__all__ = [
    "Allocation",
    "KeyDemand",
    "TwoLevels",
    "allocate",
    "redistributed",
    "shares",
    "two_levels",
]


class KeyDemand(NamedTuple):
    """One key's part in the allocation."""

    weight: float = 1.0
    min_slots: int = 0
    cap: int | None = None  # max_concurrency; None: no cap
    demand: int = 0  # running plus pending jobs


class Allocation(NamedTuple):
    slots: dict[str, int]
    idle: int


def allocate(capacity: int, keys: Mapping[str, KeyDemand]) -> Allocation:
    """Share ``capacity`` slots among ``keys`` (see the module docstring).

    O(k log k) per round of the water-filling, at most k rounds for k keys.

    >>> a = allocate(16, {"A": KeyDemand(3, 0, 12, 50_000), "B": KeyDemand(1, 2, 6, 200)})
    >>> a.slots, a.idle
    ({'A': 10, 'B': 6}, 0)
    """
    return shares(capacity, keys)[1]


def shares(capacity: int, keys: Mapping[str, KeyDemand]) -> tuple[dict[str, float], Allocation]:
    """The water-filled shares before they are made whole, and ``allocate``'s answer.

    A key whose share is below what it can use (``min(cap, demand)``) is not held back by
    its demand: its demand may change, as long as it stays above the share, without
    changing anyone's allocation. Only a change that reaches down to the share does (the
    scheduler uses this to compute the allocation again only then).
    """
    room = {name: usable(k) for name, k in keys.items()}
    got: dict[str, float] = {}
    left = capacity
    for name in sorted(keys):
        first = min(keys[name].min_slots, room[name], left)
        got[name] = float(first)
        left -= first
    share = _water_fill(float(left), keys, room, got)
    whole = {name: math.floor(share[name] + 1e-9) for name in keys}
    spare = capacity - sum(whole.values())
    # The fractional parts, largest first; only keys that can still take one.
    order = sorted(
        (name for name in keys if whole[name] < room[name]),
        key=lambda name: (-(share[name] - whole[name]), whole[name], name),
    )
    for name in order:
        if spare <= 0 or share[name] - whole[name] <= 1e-9:
            break
        whole[name] += 1
        spare -= 1
    return share, Allocation(whole, max(0, spare))


class TwoLevels(NamedTuple):
    """The allocation with two-level keys: the tenants' shares before they are made whole and
    their slots (``tenants``), and the same for the keys within their tenant's slots."""

    tenant_fracs: dict[str, float]
    tenants: Allocation
    key_fracs: dict[str, float]
    keys: Allocation


def two_levels(
    capacity: int,
    tenants: Mapping[str, KeyDemand],
    keys: Mapping[str, Mapping[str, KeyDemand]],
) -> TwoLevels:
    """Share ``capacity`` among ``tenants``, then each tenant's slots among its ``keys`` (by
    tenant). A tenant's ``demand`` is what its keys can use together (``usable`` of each,
    summed; 0 while it is paused); a tenant not in ``tenants`` gets nothing. O(k log k).

    >>> tenants = {"S": KeyDemand(demand=20), "T": KeyDemand(demand=5)}
    >>> keys = {"S": {f"S/{i}": KeyDemand(demand=2) for i in range(10)}}
    >>> keys["T"] = {"T": KeyDemand(demand=5)}
    >>> split = two_levels(8, tenants, keys)
    >>> split.tenants.slots, sum(split.keys.slots.values())
    ({'S': 4, 'T': 4}, 8)
    """
    tenant_fracs, tenant_slots = shares(capacity, tenants)
    key_fracs: dict[str, float] = {}
    slots: dict[str, int] = {}
    for tenant, own in keys.items():
        fracs, within = shares(tenant_slots.slots.get(tenant, 0), own)
        key_fracs.update(fracs)
        slots.update(within.slots)
    idle = capacity - sum(slots.values())
    return TwoLevels(tenant_fracs, tenant_slots, key_fracs, Allocation(slots, max(0, idle)))


def redistributed(capacity: int, keys: Mapping[str, KeyDemand], slots: Mapping[str, int]) -> float:
    """The slots of allocation ``slots`` that keys got beyond their weighted share of
    ``capacity`` (``capacity * weight / total weight`` of the keys with demand): what keys
    that cannot use their share (too little work, a cap) left to the others, and what
    minimums moved (seed 001's "excess redistributed"). O(k).

    >>> keys = {"A": KeyDemand(1, 0, None, 50), "B": KeyDemand(1, 0, None, 1)}
    >>> redistributed(4, keys, allocate(4, keys).slots)  # B can use 1 of its 2: A gets 3
    1.0
    """
    total = sum(k.weight for k in keys.values() if k.demand > 0)
    if total <= 0:
        return 0.0
    return sum(
        max(0.0, slots.get(name, 0) - capacity * k.weight / total)
        for name, k in keys.items()
        if k.demand > 0
    )


def usable(key: KeyDemand) -> int:
    """How many slots ``key`` can use: its demand, no more than its cap."""
    cap = key.demand if key.cap is None else min(key.cap, key.demand)
    return max(0, cap)


def _water_fill(
    left: float,
    keys: Mapping[str, KeyDemand],
    room: Mapping[str, int],
    got: dict[str, float],
) -> dict[str, float]:
    """Share ``left`` by weight among the keys below their room, clamping and sharing again
    what the clamped ones cannot take."""
    share = dict(got)
    open_keys = {name for name in keys if share[name] < room[name]}
    while left > 1e-9 and open_keys:
        total = sum(keys[name].weight for name in open_keys)
        clamped = set()
        for name in open_keys:
            offer = left * keys[name].weight / total
            if share[name] + offer >= room[name] - 1e-9:
                clamped.add(name)
        if not clamped:  # everyone takes their offer: done
            for name in open_keys:
                share[name] += left * keys[name].weight / total
            return share
        for name in clamped:  # fill these to their room and share the rest again
            left -= room[name] - share[name]
            share[name] = float(room[name])
        open_keys -= clamped
    return share
