"""The one observer: fan-out, the counters inspect stats shows, and the intake's moves."""

from __future__ import annotations

import threading

import pytest

from celery_fair.observe import GATE_COUNTS, STORE_COUNTS, Counters, Fanout, Observer
from celery_fair.worker.intake import IntakeThread


class Recording(Observer):
    """Records every event it is told, as (name, args)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[object, ...]]] = []

    def __getattribute__(self, name: str):
        if name in EVENTS:
            events = object.__getattribute__(self, "events")
            return lambda *args: events.append((name, args))
        return object.__getattribute__(self, name)


EVENTS = [n for n, v in vars(Observer).items() if callable(v) and not n.startswith("_")]
# Arguments for each event, by the names of its parameters.
ARGS = {"job_type": "clone", "priority": 8, "wait": 0.5, "elapsed": 1.5, "kind": "admit",
        "seconds": 0.002, "ok": True, "admitted": 2, "reason": "type_cap", "n": 3, "mode": "hold",
        "queue": "celery", "levels": 2, "urgent": True, "operation": "cancel",
        "answer": "cancelled", "header": "fair_priority", "fairness_key": "acme", "before": 1,
        "after": 2}  # fmt: skip


def args_for(name: str) -> tuple[object, ...]:
    code = getattr(Observer, name).__code__
    return tuple(ARGS[p] for p in code.co_varnames[1 : code.co_argcount])


class OnlyAdmitted(Observer):
    def __init__(self) -> None:
        self.admitted_calls: list[tuple[object, ...]] = []

    def admitted(self, job_type: str, priority: int, wait: float) -> None:
        self.admitted_calls.append((job_type, priority, wait))


class Handles(Observer):
    """Overrides every event (so Fanout binds each one to it)."""

    def __init__(self) -> None:
        self.seen: list[str] = []


for _name in EVENTS:
    setattr(Handles, _name, lambda self, *args, _n=_name: self.seen.append(_n))


def test_a_fanout_tells_every_observer_every_event_in_order():
    first, second = Handles(), Handles()
    fan = Fanout(first, second)
    for name in EVENTS:
        getattr(fan, name)(*args_for(name))
    assert first.seen == EVENTS
    assert second.seen == EVENTS


def test_a_fanout_binds_an_event_only_one_observer_handles_straight_to_it():
    only = OnlyAdmitted()
    fan = Fanout(Observer(), only)
    assert fan.admitted == only.admitted  # the bound method itself: no loop in between
    assert type(fan).started is Observer.started  # nobody handles it: the base no-op
    fan.admitted("clone", 8, 0.25)
    fan.started("clone", 8)
    assert only.admitted_calls == [("clone", 8, 0.25)]


def test_fanouts_nest():
    inner_one, inner_two, outer = Handles(), OnlyAdmitted(), Handles()
    fan = Fanout(Fanout(inner_one, inner_two), outer)
    fan.admitted("clone", 8, 1.0)
    fan.spilled(2)
    assert inner_one.seen == ["admitted", "spilled"]
    assert inner_two.admitted_calls == [("clone", 8, 1.0)]
    assert outer.seen == ["admitted", "spilled"]


def test_every_counter_is_moved_by_some_event_and_named_as_inspect_stats_shows_it():
    counters = Counters()
    for name in EVENTS:
        getattr(counters, name)(*args_for(name))
    counters.store_call("admit", 5.0, False)  # a failed call
    moved = {name for name, n in counters.counts.items() if n}
    assert moved == set(GATE_COUNTS) | set(STORE_COUNTS)
    stats = counters.stats()
    # The names operations.md and store.md document (and tests read).
    for name in ("fair-admitted", "fair-spilled", "fair-refreshed", "fair-dead-lettered",
                 "fair-revoked-held", "fair-duplicates", "fair-moved", "fair-store-calls",
                 "fair-store-failed", "fair-store-refused", "fair-store-given_back",
                 "fair-store-outages", "fair-store-leases_lost"):  # fmt: skip
        assert stats[name] >= 1, name
    assert len(stats) == len(GATE_COUNTS) + len(STORE_COUNTS)


@pytest.mark.parametrize(("event", "args", "count", "by"), [
    ("spilled", (4,), "spilled", 4), ("given_back", (3,), "given_back", 3),
    ("moved", ("q", 500), "moved", 500), ("rerouted", ("q", 16), "rerouted", 16),
    ("store_call", ("beat", 0.1, False), "failed", 1),
    ("store_call", ("beat", 0.1, True), "failed", 0),
])  # fmt: skip
def test_counters_count_what_the_event_says(event, args, count, by):
    counters = Counters()
    getattr(counters, event)(*args)
    assert counters.counts[count] == by


class Moves:
    """An intake that moves ``plan[queue]`` messages from each queue once, then none."""

    def __init__(self, plan: dict[str, int]) -> None:
        self.plan = dict(plan)
        self.done = threading.Event()

    def drain(self, queues):
        [queue] = queues  # the thread drains one queue at a time, to tell moves by queue
        moved = self.plan.pop(queue, 0)
        if not self.plan:
            self.done.set()
        return moved

    def close(self):
        pass


def test_the_intake_tells_its_observer_what_it_moved_from_which_queue():
    recording = Recording()
    intake = Moves({"a": 500, "b": 7})
    thread = IntakeThread(intake, lambda: ["a", "b"], 0.01, observer=recording)  # type: ignore[arg-type]
    thread.start()
    assert intake.done.wait(5)
    thread.stop()
    assert recording.events == [("moved", ("a", 500)), ("moved", ("b", 7))]


def test_every_refusal_has_one_spelling_from_the_store_to_the_metrics_and_the_docs():
    from pathlib import Path

    from celery_fair.core.types import BlockReason
    from celery_fair.observe import BLOCK_REASONS
    from celery_fair.store.base import REFUSAL_REASONS, Verdict

    # Every verdict that refuses a job is counted under a reason (the copies of a message,
    # RUNNING and DONE, are counted apart, as stalled and dropped),
    assert set(REFUSAL_REASONS) == set(Verdict) - {Verdict.ADMITTED, Verdict.RUNNING, Verdict.DONE}
    # the observer lists every reason the engine gives it (before: four of the six),
    assert set(BLOCK_REASONS) == set(REFUSAL_REASONS.values())
    # a refusal the core has a rule for is spelled as the core spells it,
    core = {reason.value for reason in BlockReason}
    assert {"tier_cap", "type_cap", "key_cap", "conflict"} <= core & set(BLOCK_REASONS)
    # and metrics.md names each.
    docs = Path(__file__).parents[2] / "docs" / "metrics.md"
    row = next(line for line in docs.read_text().splitlines() if "`refused_total`" in line)
    assert all(f"`{reason}`" in row for reason in BLOCK_REASONS), row
