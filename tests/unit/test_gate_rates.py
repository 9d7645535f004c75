"""A key's rate limit on a worker's gate: its held jobs wait while other keys' jobs take the
free slots, and the gate wakes itself when the key's bucket refills, with no poll."""

from __future__ import annotations

import pytest
from gate_world import World


@pytest.mark.parametrize("shared", [False, True], ids=["alone", "memory store"])
def test_a_key_out_of_its_rate_wakes_the_gate_when_it_refills(shared: bool) -> None:
    # Given a worker of four slots where key a may start 2 jobs a second, one at a time,
    w = World(slots=4, shared=shared, fair_keys={"a": {"rate": "2/s"}})
    for i in range(3):
        w.deliver(f"a{i}", key="a")
    w.deliver("b0", key="b")
    # its first job starts and its next waits, while key b takes a free slot;
    assert w.pool.ids() == ["a0", "b0"]
    assert w.gate.job_status("a1")["blocked_by"] == ["rate_limit"]
    # the gate has booked one decision, for when a's bucket holds a start again,
    start = w.clock.now()
    (due,) = w.timer.booked()
    assert due == pytest.approx(start + 0.5)
    # and nothing starts a moment before it;
    w.clock.advance(0.49)
    w.timer.fire_due()
    assert w.pool.ids() == ["a0", "b0"]
    # at it, a's next job starts, and the next wake is booked half a second on.
    w.clock.set(due)
    assert w.timer.fire_due() == 1
    assert w.pool.ids() == ["a0", "b0", "a1"]
    assert w.timer.booked() == [pytest.approx(due + 0.5)]


def test_a_gate_with_nothing_to_wait_for_books_no_wake() -> None:
    w = World(slots=2, shared=False)
    w.deliver("t1", key="a")
    w.deliver("t2", key="b")
    w.deliver("t3", key="c")  # held for a slot: a job's end wakes the gate, not the timer
    assert w.timer.booked() == []


def test_a_types_rate_holds_across_the_fleet_and_wakes_each_gate_when_it_refills() -> None:
    # Given two workers sharing a store, and exports limited to 2 a second, one at a time,
    one = World(slots=2)
    two = World(slots=2, store=one.store, name="w2")
    assert one.clock is two.clock
    one.deliver("e0", "export", key="a")
    # when one worker starts an export, the other's export of another key waits for the
    # type's bucket, while a build takes its other slot;
    two.deliver("e1", "export", key="b")
    two.deliver("b0", "build", key="b")
    assert one.pool.ids() == ["e0"]
    assert two.pool.ids() == ["b0"]
    assert two.gate.job_status("e1")["blocked_by"] == ["rate_limit"]
    # then that worker has booked a decision for the refill, and makes it then.
    (due,) = two.timer.booked()
    assert due == pytest.approx(two.clock.now() + 0.5)
    two.clock.set(due)
    assert two.timer.fire_due() == 1
    assert two.pool.ids() == ["b0", "e1"]
