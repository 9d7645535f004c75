"""Lanes: a queue of its own for each heavy fairness key (docs/design.md section 5f). Pure.

A queue is first in, first out, so a key with a deep backlog in a shard holds up every light
key that hashes to the same shard. A key that turns heavy is therefore given a *lane*, a queue
of its own (``q.fair.lane.<j>``), and its producers publish there while it stays heavy. Three
rules decide this, each written once, here:

- ``HeavyKeys``: when a producer's key turns heavy: the publish that makes more than
  ``threshold`` (``fair_lane_threshold``, 16) from one process within a second.
- ``Crowding``: when a worker finds a key heavy that no producer did (many producers below
  ``threshold`` each, producers that do not count, jobs slow enough that a few a second make a
  backlog): the shard it came from fills the worker's window for that shard, and the key holds
  at least half of it.
- ``LaneTable``: which lane a heavy key gets, how long it keeps it, and when its lane is given
  back. The shared store keeps one table for the fleet (the memory store uses this class; the
  Redis store states the same rule in Lua, and tests/store checks that the two agree).

(``Lane`` in fairqueue.py is another thing: one job type's queue inside a priority tier.)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "ANNOUNCE_GRACE",
    "DEFAULT_LANES",
    "DEFAULT_LANE_SECONDS",
    "DEFAULT_THRESHOLD",
    "GRACE",
    "Crowding",
    "HeavyKeys",
    "LaneMap",
    "LaneTable",
    "agreed_size",
    "fleet_sizes",
]

#: ``fair_lane_threshold``: a key is heavy once one process publishes more than this many of
#: its jobs within a second. At most this many of a heavy key's messages (per producer) land in
#: its shard before its lane, ahead of light keys there: few enough for a light key's first
#: start within 150 ms behind any burst (docs/design.md section 5f).
DEFAULT_THRESHOLD = 16
#: ``fair_lanes``: lanes per queue.
DEFAULT_LANES = 16
#: ``fair_lane_seconds``: how long an assignment lasts without renewal.
DEFAULT_LANE_SECONDS = 10.0
#: Seconds a released lane stays with its leaving key, consumed and given to no other key, so
#: that a message published by a producer that has not yet seen the release is neither lost
#: nor queued behind another key's.
GRACE = 3.0
#: How many sweeps in a row must find a lane empty before its lapsed keys may leave it.
EMPTY_SWEEPS = 2
#: Seconds a live worker may go without saying how many lanes it consumes before the fleet
#: takes it for one that consumes none (an older release) and gives no lanes out. A fair worker
#: says so within about a second of its start; until then it must not take every heavy key's
#: lane away (a worker that joins a fleet would otherwise send them all back to their shards).
ANNOUNCE_GRACE = 5.0


class HeavyKeys:
    """One producer's publishes per key, counted over a window of ``horizon`` seconds that
    starts at the key's first publish after the last window ended. A key stays heavy for a
    window after the window that made it so, so that a look once per horizon never misses a
    key that stays heavy. O(1) per publish, amortised (idle keys are pruned at most once per
    horizon).

    >>> heavy = HeavyKeys(threshold=2)
    >>> [heavy.publish("a", t) for t in (0.0, 0.1, 0.2, 0.3)]
    [False, False, True, False]
    >>> heavy.over("a", 0.5), heavy.over("a", 1.5), heavy.over("a", 2.0)
    (True, True, False)
    """

    __slots__ = ("_pruned", "_seen", "horizon", "threshold")

    def __init__(self, threshold: int = DEFAULT_THRESHOLD, horizon: float = 1.0) -> None:
        if threshold < 1:
            raise ValueError(f"threshold: expected an integer >= 1, got {threshold!r}")
        self.threshold = threshold
        self.horizon = horizon
        # _seen[key] == (when its window started, publishes in it, whether the window before
        # it, which ended as this one began, was over the threshold)
        self._seen: dict[str, tuple[float, int, bool]] = {}
        self._pruned = float("-inf")

    def publish(self, key: str, now: float, count: int = 1) -> bool:
        """Count ``count`` publishes of ``key`` at ``now``; ``True`` for the count of a window
        that makes ``key`` heavy (past ``threshold``), the moment to ask for its lane."""
        start, seen, before = self._seen.get(key, (now, 0, False))
        if now - start >= self.horizon:
            before = seen > self.threshold and now - start < 2 * self.horizon
            start, seen = now, 0
        turned = seen <= self.threshold < seen + count
        self._seen[key] = (start, seen + count, before)
        if now - self._pruned >= self.horizon:
            self._prune(now)
        return turned

    def over(self, key: str, now: float) -> bool:
        """``key`` is heavy here at ``now`` (its lane is renewed): it published more than
        ``threshold`` within its window, which ended less than a window ago at most, or the
        window before its current one did."""
        start, count, before = self._seen.get(key, (now, 0, False))
        if now - start < self.horizon and before:
            return True
        return count > self.threshold and now - start < 2 * self.horizon

    def heavy(self, now: float) -> list[str]:
        """The keys ``over`` the threshold at ``now``. O(keys seen within a horizon)."""
        return [key for key in self._seen if self.over(key, now)]

    def _prune(self, now: float) -> None:
        self._pruned = now
        old = [key for key, (start, *_) in self._seen.items() if now - start >= 2 * self.horizon]
        for key in old:
            del self._seen[key]


class Crowding:
    """A worker's held messages per queue of receipt, and the keys crowding a shard (rule 3).

    A *slot* numbers the queues a worker reads: shard i is slot i, lane j is slot
    ``shards + j``, and slot ``shards + lanes + i`` counts shard i's stragglers, messages that
    waited in it from before their key got its lane (as ``ShardTurns``, worker/shard_turns.py). A
    key *crowds* its shard when the shard's held messages reach the worker's window for one
    shard and the key holds at least half of them: the shard's FIFO is then mostly that key's
    backlog, and a light key behind it waits. The worker asks for the key's lane then, at most
    once per key per ``every`` seconds. A lane held at least half a window is *backlogged*: its
    keys still need it (their leases are renewed). O(1) per message; ``backlogged`` is
    O(lanes).

    >>> crowd = Crowding(shards=2)
    >>> for key in ("a", "a", "b"): crowd.add(0, key)
    >>> crowd.crowds(0, "b", window=4, now=0.0), crowd.add(0, "a"), crowd.crowds(0, "a", 4, 0.0)
    (False, None, True)
    >>> crowd.crowds(0, "a", 4, 0.5), crowd.crowds(0, "a", 4, 1.0)
    (False, True)
    """

    __slots__ = ("_asked", "_by_key", "_since", "every", "held", "lanes", "shards")

    def __init__(self, shards: int, lanes: int = 0, every: float = 1.0) -> None:
        self.shards = shards
        self.every = every
        self.lanes = lanes
        self.held = [0] * (2 * shards + lanes)  # slot -> held messages that came from it
        self._by_key: dict[tuple[int, str], int] = {}  # (shard slot, key) -> held of it
        self._asked: set[str] = set()  # keys asked for since ``_since``
        self._since = float("-inf")

    def add(self, slot: int, key: str) -> None:
        self.held[slot] += 1
        if slot < self.shards:
            self._by_key[slot, key] = self._by_key.get((slot, key), 0) + 1

    def remove(self, slot: int, key: str) -> None:
        if self.held[slot] > 0:
            self.held[slot] -= 1
        if slot < self.shards:
            left = self._by_key.get((slot, key), 0) - 1
            if left > 0:
                self._by_key[slot, key] = left
            else:
                self._by_key.pop((slot, key), None)

    def crowds(self, slot: int, key: str, window: int, now: float) -> bool:
        """``key`` crowds shard ``slot`` at ``now``, and was not found to within ``every``
        seconds: the moment to ask for its lane."""
        if slot >= self.shards or self.held[slot] < window:
            return False
        if 2 * self._by_key.get((slot, key), 0) < window:
            return False
        if now - self._since >= self.every:
            self._asked.clear()
            self._since = now
        if key in self._asked:
            return False
        self._asked.add(key)
        return True

    def stragglers(self) -> dict[int, int]:
        """Held stragglers by the shard they waited in (those that have some). O(shards)."""
        first = self.shards + self.lanes
        return {i: n for i, n in enumerate(self.held[first:]) if n}

    def backlogged(self, window: int) -> list[int]:
        """The lanes (numbered from 0) held at least half a ``window``."""
        held = self.held
        return [j for j in range(self.lanes) if 2 * held[self.shards + j] >= window]


def agreed_size(announced: Iterable[int | None]) -> int:
    """The lanes the fleet agrees on: the fewest any live worker consumes, and none while a
    live worker has not said (an older release, which consumes none) or there is no worker.

    >>> agreed_size([16, 8]), agreed_size([16, None]), agreed_size([])
    (8, 0, 0)
    """
    sizes = list(announced)
    if not sizes or any(size is None for size in sizes):
        return 0
    return min(size for size in sizes if size is not None)


def fleet_sizes(
    live: Iterable[str],
    announced: Mapping[str, int],
    silent_since: dict[str, float],
    now: float,
) -> list[int | None]:
    """What each live worker says, for ``agreed_size``: the lanes it announced; ``None`` for
    one that has been seen live without announcing for ``ANNOUNCE_GRACE`` seconds (an older
    release); nothing yet for one silent for less. ``silent_since`` keeps when each silent live
    worker was first seen so: updated here (entered, and dropped for workers that announced or
    are no longer live). O(live workers + silent ones).

    >>> silent = {}
    >>> fleet_sizes(["w1", "w2"], {"w1": 16}, silent, 10.0), silent
    ([16], {'w2': 10.0})
    >>> fleet_sizes(["w1", "w2"], {"w1": 16}, silent, 15.0)
    [16, None]
    """
    live = list(live)
    sizes: list[int | None] = []
    for worker in live:
        if worker in announced:
            sizes.append(announced[worker])
        elif now - silent_since.setdefault(worker, now) >= ANNOUNCE_GRACE:
            sizes.append(None)
    keep = {worker for worker in live if worker not in announced}
    for worker in [w for w in silent_since if w not in keep]:
        del silent_since[worker]
    return sizes


@dataclass(frozen=True, slots=True)
class LaneMap:
    """What producers route by: the keys that have a lane now, the table's version, and how
    many lanes the fleet agrees on (0: none is given)."""

    version: int
    lanes: Mapping[str, int]  # fairness key -> its lane
    size: int = 0

    def lane_of(self, key: str) -> int | None:
        return self.lanes.get(key)


@dataclass(slots=True)
class _Assignment:
    lane: int
    renewed: float
    leaving_since: float | None = None  # released: producers route the key to its shard


class LaneTable:
    """The fleet's lanes: which heavy key has which lane. Every operation is O(1) in the
    number of keys but ``sweep`` and ``resize``, O(assignments), made once per worker sweep.

    A key asks for a lane when it turns heavy: it gets the lane with the fewest keys, lowest
    first, so a lane is a key's alone while at most ``size`` keys are heavy. It keeps the lane
    while renewed within ``lease`` seconds (a producer still over the threshold, a worker still
    holding a backlog of it). Once the lease has lapsed *and* sweeps have found the lane empty
    ``EMPTY_SWEEPS`` times in a row, the key leaves: producers route it to its shard again, and
    the lane stays its own for ``grace`` seconds, then is free. A key with messages in its lane
    never leaves, so its messages keep their order across the switch back.

    >>> table = LaneTable(size=2)
    >>> table.ask("a", 0.0), table.ask("b", 0.0), table.ask("c", 0.0), table.ask("a", 1.0)
    (0, 1, 0, 0)
    >>> table.map().lanes
    {'a': 0, 'b': 1, 'c': 0}
    """

    def __init__(
        self, size: int = 0, lease: float = DEFAULT_LANE_SECONDS, grace: float = GRACE
    ) -> None:
        self.size = size
        self.lease = lease
        self.grace = grace
        self.version = 0
        self._keys: dict[str, _Assignment] = {}
        self._owners: dict[int, set[str]] = {}  # lane -> its keys (leaving ones included)
        self._empty: dict[int, int] = {}  # lane -> sweeps in a row that found it empty

    def map(self) -> LaneMap:
        """The keys producers route to a lane now. O(assignments)."""
        lanes = {k: a.lane for k, a in self._keys.items() if a.leaving_since is None}
        return LaneMap(self.version, lanes, self.size)

    def lane_of(self, key: str) -> int | None:
        assignment = self._keys.get(key)
        return (
            None if assignment is None or assignment.leaving_since is not None else assignment.lane
        )

    def ask(self, key: str, now: float) -> int | None:
        """``key`` turned heavy: its lane (renewed; a leaving key gets its lane back if the
        fleet still has it), or ``None`` if the fleet has no lanes. O(size) for a new key,
        O(1) otherwise."""
        assignment = self._keys.get(key)
        if assignment is not None and assignment.lane < self.size:
            assignment.renewed = now
            if assignment.leaving_since is not None:
                assignment.leaving_since = None
                self.version += 1
            return assignment.lane
        if assignment is not None:  # leaving a lane beyond those agreed now: a new one
            self._drop(key, assignment)
        if self.size < 1:
            return None
        lane = min(range(self.size), key=lambda j: (len(self._owners.get(j, ())), j))
        self._keys[key] = _Assignment(lane, now)
        self._owners.setdefault(lane, set()).add(key)
        self.version += 1
        return lane

    def renew(self, keys: Collection[str], now: float) -> None:
        """``keys`` are still heavy: their leases run from ``now``. A key without a lane, or
        leaving it, is left as it is (it asks again if it needs one)."""
        for key in keys:
            assignment = self._keys.get(key)
            if assignment is not None and assignment.leaving_since is None:
                assignment.renewed = now

    def sweep(self, empty: Collection[int], looked: Collection[int], now: float) -> None:
        """A worker looked at the lanes ``looked`` at ``now`` and found ``empty`` of them with
        no message waiting: keys whose lease lapsed leave a lane found empty ``EMPTY_SWEEPS``
        times in a row, and leaving keys past their grace let their lane go."""
        for lane in looked:
            self._empty[lane] = self._empty.get(lane, 0) + 1 if lane in empty else 0
        changed = False
        for key, assignment in list(self._keys.items()):
            if assignment.leaving_since is not None:
                if now - assignment.leaving_since >= self.grace:
                    self._drop(key, assignment)
                continue
            lapsed = now - assignment.renewed >= self.lease
            if lapsed and self._empty.get(assignment.lane, 0) >= EMPTY_SWEEPS:
                assignment.leaving_since = now
                changed = True
        if changed:
            self.version += 1

    def resize(self, size: int, now: float) -> None:
        """The fleet now agrees on ``size`` lanes (``agreed_size``): keys on lanes beyond it
        leave them at once (not every worker consumes those lanes)."""
        if size == self.size:
            return
        self.size = size
        for assignment in self._keys.values():
            if assignment.lane >= size and assignment.leaving_since is None:
                assignment.leaving_since = now
        self.version += 1

    def _drop(self, key: str, assignment: _Assignment) -> None:
        del self._keys[key]
        owners = self._owners[assignment.lane]
        owners.discard(key)
        if not owners:
            del self._owners[assignment.lane]
