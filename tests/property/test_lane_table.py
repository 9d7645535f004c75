"""Random asks, renewals, sweeps and resizes against the lane table's stated promises
(core/lanes.py): one lane per key, owners as assigned, a lane a key's alone while lanes
remain, no key leaving a lane that holds messages, and a version that moves exactly when
what producers route by changes."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from celery_fair.core.lanes import LaneTable

KEYS = st.sampled_from([f"k{i}" for i in range(8)])
LANES = st.sets(st.integers(0, 5))


class LaneTableMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.table = LaneTable(size=3, lease=5.0, grace=2.0)
        self.now = 0.0

    def _changes(self, act) -> object:
        found = self.table.map()
        before = ((found.lanes, found.size), found.version)
        result = act()
        found = self.table.map()
        after = ((found.lanes, found.size), found.version)
        assert (before[0] != after[0]) == (before[1] != after[1])
        assert after[1] >= before[1]
        return result

    @rule(key=KEYS)
    def ask(self, key: str) -> None:
        table = self.table
        had = table.lane_of(key)
        taken = {a.lane for a in table._keys.values()}
        new = key not in table._keys
        lane = self._changes(lambda: table.ask(key, self.now))
        if table.size == 0:
            if new:
                assert lane is None
            return
        assert lane is not None
        assert table.lane_of(key) == lane
        if had is not None:
            assert lane == had  # a key keeps its lane
        if new and len(taken & set(range(table.size))) < table.size:
            assert lane not in taken  # a free lane while one remains

    @rule(keys=st.lists(KEYS, max_size=3))
    def renew(self, keys: list[str]) -> None:
        routed = self.table.map().lanes
        self._changes(lambda: self.table.renew(keys, self.now))
        assert self.table.map().lanes == routed

    @rule(empty=LANES, looked=LANES)
    def sweep(self, empty: set[int], looked: set[int]) -> None:
        empty &= looked
        table = self.table
        routed = table.map().lanes
        self._changes(lambda: table.sweep(empty, looked, self.now))
        for key, lane in routed.items():
            if lane in looked and lane not in empty:
                assert table.lane_of(key) == lane  # never leaves a lane holding messages

    @rule(seconds=st.floats(0.0, 4.0))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @rule(size=st.integers(0, 4))
    def resize(self, size: int) -> None:
        self._changes(lambda: self.table.resize(size, self.now))
        assert all(lane < size for lane in self.table.map().lanes.values())

    @invariant()
    def owners_are_the_assignments(self) -> None:
        table = self.table
        by_lane: dict[int, set[str]] = {}
        for key, assignment in table._keys.items():
            by_lane.setdefault(assignment.lane, set()).add(key)
        assert by_lane == table._owners


TestLaneTable = LaneTableMachine.TestCase
