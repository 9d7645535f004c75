"""Which shard the Redis transport reads next: first the ones the gate holds too few of.

Kombu's Redis transport fetches one message per ``BRPOP`` over every consumed queue, in turns
(it moves the queue it last read from to the end of the list). The gate's window on Redis is
small (what it can start plus one per shard, window.py), so what it holds follows those turns,
not its own decisions: with two clients backlogged, it holds about as many of each, and when
it starts three of one key's jobs for each of the other's (a weight of 3, or cheaper jobs), the
next fetches still alternate, the faster key's held jobs run out, and its share falls to the
turns' one in two.

So each ``BRPOP`` lists first the shards the gate holds fewer than a window of (what it can
start plus one, as RabbitMQ's per-consumer windows, consumer_prefetch.py) and last those it
holds enough of. ``BRPOP`` pops the first non-empty list, so a shard the gate needs is read
first, a newcomer's included, and when none of them has a message the others are read as
before: the order never makes the worker wait. The counts are kept as the gate holds and lets
go of messages: by the queue they came from when that is a lane (a heavy key's queue of its
own, core/lanes.py; its messages carry the lane's name as their routing key), else by the
shard of their fairness key (``routing.shard_of``), which is where the intake put them.
"""

from __future__ import annotations

from collections.abc import Callable

from ..protocol import lane_index, shard_index, shard_of

__all__ = ["ShardTurns", "slot_of"]

_NOT_A_SLOT = float("inf")
"""How far behind a queue that is no shard or lane counts: after every shard and lane."""


def slot_of(routing_key: object, key: str, lane: int | None, shards: int, lanes: int) -> int:
    """The slot (shard i: i; lane j: ``shards + j``; the stragglers of shard i:
    ``shards + lanes + i``) a held message of fairness key ``key`` counts in, ``lane`` being
    its key's lane now, if any:

    - the lane its routing key names;
    - a *straggler* of its shard if its routing key names a shard and its key has a lane now:
      it waited in the shard from before its key got its lane, and more of them may wait there
      ahead of a light key: it does not count in its shard, which is read first on Redis
      (``order``), and on RabbitMQ the shard consumer's window opens past them
      (consumer_prefetch.py);
    - the shard its routing key names;
    - else (the intake moved it, keeping the queue's own routing key) its key's lane, or its
      key's shard, where the intake put it. O(1).

    >>> slot_of("q.fair.lane.1", "a", None, 2, 3), slot_of("q.fair.1", "a", None, 2, 3)
    (3, 1)
    >>> slot_of("q.fair.1", "a", 2, 2, 3)  # a straggler of shard 1
    6
    >>> slot_of("q", "a", 2, 2, 3) == 4, slot_of("q", "a", None, 2, 3) == shard_of("a", 2)
    (True, True)
    """
    laned = lane is not None and lane < lanes
    if isinstance(routing_key, str):
        named = lane_index(routing_key)
        if named is not None and named < lanes:
            return shards + named
        shard = shard_index(routing_key)
        if shard is not None and shard < shards:
            return shards + lanes + shard if laned else shard
    return shards + lane if lane is not None and laned else shard_of(key, shards)


class ShardTurns:
    """Held messages per shard and per lane, and the order of queues they call for. Pure.
    A *slot* numbers them: shard i is slot i, lane j is slot ``shards + j``, and the
    stragglers of shard i (``slot_of``) are slot ``shards + lanes + i``, which orders no queue.

    >>> turns = ShardTurns(shards=4, window=lambda: 2)
    >>> turns.add(1); turns.add(1)
    >>> turns.order(["q.fair.1", "q.fair.3", "q"])
    ['q.fair.3', 'q', 'q.fair.1']
    >>> turns.remove(1)
    >>> turns.order(["q", "q.fair.1", "q.fair.3"])
    ['q.fair.3', 'q', 'q.fair.1']
    """

    def __init__(self, shards: int, window: Callable[[], int], lanes: int = 0) -> None:
        self.shards = shards
        self.lanes = lanes
        self.held = [0] * (2 * shards + lanes)
        self._window = window
        self._index: dict[str, int | None] = {}  # queue name -> slot, as parsed
        # How far behind the keys of a slot are (their least accumulated cost; lower: further
        # behind), to order the queues held none of; None: in their turns.
        self.behind: Callable[[int], float] | None = None
        # Two-level keys: ``behind`` orders the queues held none of and those held less than a
        # window of together (a tenant's cost says more than whether any is held).
        self.behind_first = False

    def add(self, slot: int) -> None:
        self.held[slot] += 1

    def remove(self, slot: int) -> None:
        if self.held[slot] > 0:
            self.held[slot] -= 1

    def read(self, held: list[int]) -> None:
        """Order by ``held``, counts per slot kept elsewhere (``core.lanes.Crowding``, which
        numbers the slots alike), instead of counting here."""
        if len(held) != len(self.held):
            raise ValueError(f"held: expected {len(self.held)} slots, got {len(held)}")
        self.held = held

    def lanes_held(self) -> int:
        """How many lanes the gate holds messages of. O(lanes)."""
        return sum(1 for n in self.held[self.shards : self.shards + self.lanes] if n)

    def _slot(self, name: str) -> int | None:
        shard = shard_index(name)
        if shard is not None:
            return shard
        lane = lane_index(name)
        return None if lane is None else self.shards + lane

    def order(self, queues: list[str]) -> list[str]:
        """``queues`` (the transport's turn order) in three groups, each in its turn order:
        the shards and lanes the gate holds none of, the rest, and last those it holds a window
        of; with ``behind`` set, the first two each by how far behind their keys are (least
        accumulated cost first, ties in turn order). O(queues log queues).

        A queue held none of is one whose keys the core cannot pick now, however far behind
        their share they are: a lane whose key the core started as fast as it came (a key
        catching up after a late start, a weighted key, cheaper jobs), or a light key's shard.
        Read first, its next message is in hand by the time the core would start it; in turns,
        it would wait for a read of every other backlogged queue. Among them, the lanes of keys
        that just started their held job come and go in every read; in turns with them, a key
        catching up would get its next message one read in as many as there are, and so only
        its even share of starts, never the catch-up its cost calls for."""
        window = self._window()
        held = self.held
        index = self._index
        first: list[str] = []
        middle: list[str] = []
        later: list[str] = []
        for name in queues:
            i = index.get(name, -1)
            if i == -1:
                i = index[name] = self._slot(name)
            if i is None or i >= len(held):
                middle.append(name)
            elif held[i] == 0:
                first.append(name)
            elif held[i] >= window:
                later.append(name)
            else:
                middle.append(name)
        behind = self.behind
        if behind is not None:
            # Each group the furthest behind first, ties in turn order (the sort is stable); a
            # queue that is no shard or lane (the queue itself, which the intake empties)
            # after them.
            def by(name: str) -> float:
                slot = index[name]
                return _NOT_A_SLOT if slot is None else behind(slot)

            if self.behind_first:
                # With two-level keys a heavy tenant's shards (its light keys, or the
                # stragglers its keys left there before their lanes) may be held none of while
                # a tenant far behind has a lane held some of: the cost decides, then what is
                # held none of.
                merged = [(by(name), 0, name) for name in first]
                merged += [(by(name), 1, name) for name in middle]
                merged.sort(key=lambda item: (item[0], item[1]))
                return [name for _, _, name in merged] + later
            first.sort(key=by)
            middle.sort(key=by)
        return first + middle + later
