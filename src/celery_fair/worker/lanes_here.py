"""A worker's part in the lanes (core/lanes.py): where a held message counts, and rule 3.

Producers give a key its lane when they publish it heavily (rule 1, ``routing.Lanes``). A key
can back up in its shard without any producer seeing it: many producers each below the
threshold, or jobs so slow (or so blocked) that a few a second make a backlog. (Producers that
read no map, of an older release or with ``fair_lanes = 0``, keep publishing to the shard.)
The worker sees it: what it holds of the shard fills its window for one shard, and one key
holds at least half of it (``Crowding``). The worker then asks the store for the key's lane,
as a producer would; every producer routes the key to it from its next read of the map (about
a second), and the worker renews the lease while the key's lane stays backlogged here. A false
alarm costs a lane for a lease.

Each held message counts in the slot of the queue it came from (``shard_turns.slot_of``): the
Redis read order reads those counts too (``ShardTurns``), and on RabbitMQ they say which held
stragglers a shard's window opens past (``read_past``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.lanes import Crowding
from ..protocol import base_name, lane_index, shard_name, shard_of
from .held import HeldJobs
from .shard_turns import slot_of

__all__ = ["LanesHere"]


class LanesHere:
    """``lanes``: the app's ``routing.Lanes`` (the fleet's map as this process knows it, and
    the store to ask); ``shards`` and ``consumed``: the shards and lanes per queue this worker
    reads; ``window``: its window for one shard now (what it can start plus one);
    ``now``: a monotonic clock. The gate calls it under its lock."""

    def __init__(
        self,
        lanes: Any,
        shards: int,
        consumed: int,
        window: Callable[[], int],
        now: Callable[[], float],
    ) -> None:
        self.lanes = lanes
        self.shards = shards
        self.consumed = consumed
        self.crowding = Crowding(shards, consumed)
        self._window = window
        self._now = now
        self.asked = 0  # lanes asked for by rule 3, since the worker started
        self._fresh: str | None = None  # the key whose lane ``slot`` just learned
        # The fleet's map as last read for ``behind``, and its keys by lane.
        self._by_lane: tuple[Any, dict[int, list[str]]] = (None, {})
        # The key of the last message held from each shard (``behind_tenants``).
        self._last: dict[int, str] = {}
        # The list the Redis transport is delivering a message from, during the delivery.
        self._source: str | None = None

    def read_from(self, queue: str | None) -> None:
        """The Redis transport delivers a message it read from ``queue`` now (``None``: that
        delivery is over; ``internals.note_redis_sources``). The message counts in the queue
        it was read from, whatever routing key it was published with: the intake moves a
        message unchanged, so one it moved from its shard to its lane still names the shard,
        and counted as a straggler it would send the intake to look for stragglers in a shard
        that has none left, once for each. On the loop's thread: one assignment."""
        self._source = queue

    def _came_from(self, req: Any) -> Any:
        """The queue ``req`` was read from, if the transport said; else its routing key."""
        if self._source is not None:
            return self._source
        return (getattr(req, "delivery_info", None) or {}).get("routing_key")

    def slot(self, req: Any, key: str) -> int:
        """The slot ``req`` (of fairness key ``key``) counts in. A message that came from a
        lane says that its key has that lane: the worker knows it from then on, without
        waiting for its next read of the fleet's map (``routing.Lanes.learn``)."""
        routing_key = self._came_from(req)
        lane = self.lanes.map.lane_of(key)
        named = lane_index(routing_key) if isinstance(routing_key, str) else None
        if named is not None and named < self.consumed and named != lane:
            self.lanes.learn(key, named)
            self._fresh = key
            lane = named
        return slot_of(routing_key, key, lane, self.shards, self.consumed)

    def straggler(self, slot: int) -> bool:
        """``slot`` counts stragglers: messages of a key with a lane that waited in its shard
        from before it got the lane (``shard_turns.slot_of``)."""
        return slot >= self.shards + self.consumed

    def straggler_slot(self, key: str) -> int:
        """The slot of the stragglers of ``key``'s shard."""
        return self.shards + self.consumed + shard_of(key, self.shards)

    def shard_queue(self, req: Any, key: str) -> str:
        """The name of the shard ``req``'s stragglers of ``key`` wait in: its key's shard of
        the queue ``req`` came from."""
        routing_key = self._came_from(req)
        return shard_name(base_name(str(routing_key)), shard_of(key, self.shards))

    def held(self, jobs: HeldJobs, slot: int, key: str) -> bool:
        """A message of ``key`` from ``slot`` is now held (``jobs.add`` counted it): if
        ``key`` crowds its shard and has no lane yet, ask for one (one store call, at most once
        per key a second; a store that fails is logged by ``Lanes``). If ``key`` has a lane it
        did not have at its last message here (learned from this one, or given), what is held
        of it from its shard are stragglers from now on (``HeldJobs.reslot``). ``True`` if
        stragglers are held because of this message: the shard's window may have to open."""
        fresh, self._fresh = self._fresh == key, None
        if slot < self.shards:
            self._last[slot] = key
        elif self.straggler(slot):
            self._last[slot - self.shards - self.consumed] = key
        crowds = self.crowding.crowds(slot, key, self._window(), self._now())
        if crowds and self.lanes.map.lane_of(key) is None:
            self.asked += 1
            fresh = self.lanes.ask(key) is not None or fresh
        straggling = self.straggler(slot)
        if fresh:
            shard = shard_of(key, self.shards)
            straggling = jobs.reslot(key, shard, self.straggler_slot(key)) > 0 or straggling
        return straggling

    def read_past(self) -> dict[int, int]:
        """The held stragglers, by the shard they waited in, that the shard's window opens past
        on RabbitMQ (consumer_prefetch.py): those of a shard one of whose keys has messages
        here from its lane. Those messages are the key's newer ones, so its stragglers are the
        few it left in the shard before producers routed it to its lane (rule 1), and a light
        key behind them should not wait for them all. A key this worker holds nothing of from
        its lane has nothing waiting there (the lane's consumer here has room: the broker
        would send them): its stragglers are its whole backlog, left in the shard before it
        had a lane (published before the workers started, or found by rule 3), and drain
        from the shard as any backlog, a window at a time by every worker. Read past, they
        would all go to the first worker there, to run alone while the others idle.
        O(shards + keys with a lane)."""
        stragglers = self.crowding.stragglers()
        if not stragglers:
            return {}
        held, shards = self.crowding.held, self.shards
        laned = {
            shard_of(key, shards)
            for key, lane in self.lanes.map.lanes.items()
            if lane < self.consumed and held[shards + lane]
        }
        return {i: n for i, n in stragglers.items() if i in laned}

    def lane_opened(self, slot: int) -> bool:
        """A message from ``slot`` is now held (counted): it is the first held from its lane
        while stragglers are held, so a shard's window may now open past them
        (``read_past``). O(1), O(shards) at such a first."""
        lane = slot - self.shards
        if lane < 0 or lane >= self.consumed or self.crowding.held[slot] != 1:
            return False
        return bool(self.crowding.stragglers())

    def behind(self, slot: int, cost: Callable[[str], float]) -> float:
        """How far behind the keys of ``slot`` are, for the read order (``ShardTurns.behind``):
        a lane's, the least ``cost`` (``Scheduler.read_cost``: accumulated cost, ``inf`` out
        of its rate) of the keys the fleet's map puts on it; a shard's (light keys, new ones
        among them) 0. O(keys of the lane), the map's lanes read once per version of it."""
        lane = slot - self.shards
        if lane < 0 or lane >= self.consumed:
            return 0.0
        lanes = self.lanes.map
        if self._by_lane[0] is not lanes:
            by_lane: dict[int, list[str]] = {}
            for key, j in lanes.lanes.items():
                by_lane.setdefault(j, []).append(key)
            self._by_lane = (lanes, by_lane)
        keys = self._by_lane[1].get(lane)
        return min(map(cost, keys)) if keys else 0.0

    def behind_tenants(self, slot: int, cost: Callable[[str], float]) -> float:
        """``behind`` with two-level keys (``cost``: a key's tenant's accumulated cost, ``inf``
        while the key or its tenant is out of its rate). A lane's, as ``behind``; a shard's,
        the cost of the last key held from it (0 before any). Under flat keys a shard's light
        keys are the furthest behind; with tenants, its light keys may be a heavy tenant's (one
        that spreads its backlog over many keys), and read first they would keep a one-key
        tenant's lane unread while its next start is due. Its next messages are likely the
        same tenant's: while that tenant is out of its rate none of them could start, and the
        shard is read after every queue with room. O(1) for a shard, as ``behind`` for a
        lane."""
        if slot < self.shards:
            last = self._last.get(slot)
            return 0.0 if last is None else cost(last)
        return self.behind(slot, cost)

    def backlogged_keys(self) -> list[str]:
        """The keys whose lane this worker holds at least half a window of: they still need
        it (the lane watch renews them). Read from the lane watch's thread: it only reads a
        list and an immutable map."""
        lanes = set(self.crowding.backlogged(self._window()))
        if not lanes:
            return []
        return [key for key, lane in self.lanes.map.lanes.items() if lane in lanes]
