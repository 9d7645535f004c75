"""The lane table answers alike in memory (core/lanes.py's LaneTable itself) and in Redis
(lua/lanes.lua, the same rule stated again), on any sequence of asks, renewals, sweeps,
heartbeats and moves of the clock.

Time decides here (leases, the grace), so both stores must read one clock. The in-memory store
takes a ``SimClock``. Redis's ``TIME`` cannot be set, so the Redis store runs its real scripts
with one change: ``now_s`` (common.lua) reads the time from a key of the test's prefix, which the
test sets. Everything else is the real Redis and the real scripts, to the last comparison, so a
lease that lapses exactly at a sweep (the clock moves in steps that add up exactly) is decided
the same way in both, or the test says where they part.
"""

from __future__ import annotations

import uuid
from importlib import resources

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from shared_redis import REDIS_URL, clean

from celery_fair.core import CostLifecycle
from celery_fair.core.clock import SimClock
from celery_fair.core.lanes import GRACE
from celery_fair.store import MemoryStore, RedisStore
from celery_fair.store.redis import _SCRIPTS

WORKERS = ("w1", "w2")
KEYS = ("a", "b|c", "ключ:", "")
LANES = st.lists(st.integers(0, 2), max_size=3)
# Most sweeps are w1's, so that the fleet often agrees on lanes (every live worker announced).
MOSTLY_W1 = st.just("w1") | st.sampled_from(WORKERS)
# The clock moves by 1, 2 or 3 s, so that it often lands exactly on a lease's or the grace's
# end, where a >= written as > would show.
LEASE = 4.0  # a worker's
LANE_SECONDS = 2.0  # an assignment's (GRACE is core/lanes.py's 3.0)
START = 1_700_000_000.0

#: Put right after common.lua: every script's ``local now = now_s()`` then reads the test's clock.
TEST_CLOCK = """
local function now_s() return tonumber(redis.call('GET', string.sub(META, 1, -5) .. 'clock')) end
"""


def on_test_clock(store: RedisStore) -> str:
    """Make ``store``'s scripts read the time from ``{prefix}:clock``; return that key."""
    lua = resources.files("celery_fair.store") / "lua"
    for name in _SCRIPTS:
        script = (lua / f"{name}.lua").read_text()
        source = store._sources[name]
        assert source.endswith(script)
        source = source[: -len(script)] + TEST_CLOCK + script
        store._sources[name] = source
        store._scripts[name] = store.client.register_script(source)
    return f"{{{store.prefix}}}:clock"


class BothStores(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"test-lanes-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(REDIS_URL)
        options = {"lifecycle": CostLifecycle.never(), "lease": LEASE, "lane_seconds": LANE_SECONDS}
        self.redis = RedisStore(redis.Redis.from_url(REDIS_URL), self.prefix, **options)
        self.clock_key = on_test_clock(self.redis)
        self.clock = SimClock(START)
        self.memory = MemoryStore(**options, clock=self.clock)
        self._tell_redis()
        # Versions start at each table's creation; they must move by the same steps.
        self.first = (self.memory.lanes(-1).version, self.redis.lanes(-1).version)

    def teardown(self) -> None:
        self.redis.close()
        clean(self.client, self.prefix)
        self.client.close()

    def _tell_redis(self) -> None:
        self.client.set(self.clock_key, repr(self.clock.now()))

    def both(self, op: str, *args: object) -> tuple[object, object]:
        return getattr(self.memory, op)(*args), getattr(self.redis, op)(*args)

    @rule(seconds=st.sampled_from([1.0, 2.0, 3.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._tell_redis()

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker: str) -> None:
        mine, theirs = self.both("heartbeat", worker, [], [])
        assert mine.now == theirs.now == self.clock.now()  # one clock
        assert mine.workers == theirs.workers

    @rule(
        worker=MOSTLY_W1,
        size=st.just(3) | st.integers(0, 3),  # a worker's size rarely changes
        looked=LANES,
        empty=st.none() | LANES,
    )
    def sweep(self, worker: str, size: int, looked: list[int], empty: list[int] | None) -> None:
        # Often every lane looked at is empty (leases lapse only then); otherwise lanes are
        # also named as a worker would not (twice, empty but not looked at), which the stores
        # take alike (store/base.py, lane_sweep).
        self.both("sweep_lanes", worker, size, looked, looked if empty is None else empty)

    @rule(key=st.sampled_from(KEYS))
    def ask(self, key: str) -> None:
        mine, theirs = self.both("ask_lane", key)
        assert mine == theirs, (key, mine, theirs)

    @rule(keys=st.lists(st.sampled_from(KEYS), max_size=3))
    def renew(self, keys: list[str]) -> None:
        self.both("renew_lanes", keys)

    @invariant()
    def same_table(self) -> None:
        """Not only what the stores answer: the whole table, so that a difference shows at the
        step that makes it (a key given back a step early shows only later in an answer)."""
        assert self._memory_table() == self._redis_table()

    def _memory_table(self) -> dict[str, object]:
        table = self.memory.lane_table
        return {
            "keys": {k: (a.lane, a.renewed, a.leaving_since) for k, a in table._keys.items()},
            "owners": {lane: len(keys) for lane, keys in table._owners.items()},
            "streaks": {lane: n for lane, n in table._empty.items() if n},
            "size": table.size,
            "announced": dict(self.memory._announced),
        }

    def _redis_table(self) -> dict[str, object]:
        """The lanes hash as lua/lanes.lua keeps it (common.lua describes its fields)."""
        fields = {
            f.decode(): v.decode()
            for f, v in self.client.hgetall(f"{{{self.prefix}}}:lanes").items()
        }
        keys, owners, streaks, announced = {}, {}, {}, {}
        for field, value in fields.items():
            kind, name = field[:2], field[2:]
            if kind == "k:":
                lane, renewed, leaving = value.split("|")
                keys[name] = (int(lane), float(renewed), float(leaving) if leaving else None)
            elif kind == "n:":
                owners[int(name)] = int(value)
            elif kind == "e:":
                streaks[int(name)] = int(value)
            elif kind == "w:":
                announced[name] = int(value)
        size = int(fields.get("size", 0))
        return {"keys": keys, "owners": owners, "streaks": streaks, "size": size,
                "announced": announced}  # fmt: skip

    @invariant()
    def same_map_and_versions(self) -> None:
        mine, theirs = self.both("lanes", -1)
        assert mine.lanes == theirs.lanes, (mine.lanes, theirs.lanes)
        assert mine.version - self.first[0] == theirs.version - self.first[1]
        assert self.memory.lanes(mine.version) is None
        assert self.redis.lanes(theirs.version) is None


TestLanesAgree = BothStores.TestCase
TestLanesAgree.settings = settings(stateful_step_count=50, max_examples=200, deadline=None)


class Pair:
    """Both stores on one test clock, for examples at the exact edges of the lease, the empty
    sweeps and the grace; each call answers the same in both, or fails saying both answers."""

    def __init__(self) -> None:
        self.machine = BothStores()
        self.machine.sweep("w1", 3, [], [])

    def __getattr__(self, op: str):
        def call(*args: object) -> object:
            mine, theirs = self.machine.both(op, *args)
            assert mine == theirs, (op, args, mine, theirs)
            self.machine.same_table()
            return mine

        return call

    def advance(self, seconds: float) -> None:
        self.machine.advance(seconds)

    def routed(self) -> dict[str, int]:
        self.machine.same_map_and_versions()
        return dict(self.machine.memory.lanes(-1).lanes)


@pytest.fixture
def pair():
    made = Pair()
    yield made
    made.machine.teardown()


def test_a_key_leaves_when_its_lease_ends_exactly_at_the_second_empty_sweep(pair):
    assert pair.ask_lane("a") == 0
    pair.sweep_lanes("w1", 3, [0], [0])
    pair.advance(LANE_SECONDS / 2)
    pair.sweep_lanes("w1", 3, [0], [0])  # empty twice, lease running
    assert pair.routed() == {"a": 0}
    pair.advance(LANE_SECONDS / 2)  # exactly its end
    pair.sweep_lanes("w1", 3, [0], [0])
    assert pair.routed() == {}


def test_a_lane_found_holding_messages_keeps_its_key_even_after_empty_sweeps_before(pair):
    assert pair.ask_lane("a") == 0
    pair.sweep_lanes("w1", 3, [0], [0])
    pair.sweep_lanes("w1", 3, [0], [0])
    pair.advance(LANE_SECONDS)
    pair.sweep_lanes("w1", 3, [0], [])  # lapsed, but a message waits: the streak starts over
    assert pair.routed() == {"a": 0}
    pair.sweep_lanes("w1", 3, [0], [0])
    assert pair.routed() == {"a": 0}
    pair.sweep_lanes("w1", 3, [0], [0])
    assert pair.routed() == {}


def test_a_lane_goes_to_another_key_exactly_when_the_grace_ends(pair):
    assert pair.ask_lane("b") == 0
    pair.advance(LANE_SECONDS)
    pair.sweep_lanes("w1", 3, [0], [0])
    pair.sweep_lanes("w1", 3, [0], [0])  # b leaves now
    pair.advance(GRACE - 1.0)
    pair.sweep_lanes("w1", 3, [], [])
    assert pair.ask_lane("c") == 1  # lane 0 is still b's
    pair.advance(1.0)  # exactly the grace
    pair.sweep_lanes("w1", 3, [], [])
    assert pair.ask_lane("d") == 0
    assert pair.routed() == {"c": 1, "d": 0}


def test_the_redis_store_reads_the_test_clock(redis_client):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix)
    try:
        redis_client.set(on_test_clock(store), "1234.5")
        assert store.heartbeat("w1", [], []).now == 1234.5
    finally:
        store.close()
        clean(redis_client, prefix)


@pytest.fixture(autouse=True)
def _redis_up():
    with redis.Redis.from_url(REDIS_URL) as client:
        client.ping()  # a missing Redis fails the test; it is never skipped
