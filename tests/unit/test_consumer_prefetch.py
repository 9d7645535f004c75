"""Each shard's own window on RabbitMQ (worker/consumer_prefetch.py): narrow while work flows,
opened while held work blocks an idle slot, grown by the ETA tasks a shard has waiting."""

from __future__ import annotations

from celery_fair.worker.consumer_prefetch import NARROW_AFTER, ShardPrefetch
from celery_fair.worker.window import CHUNK, SETTLE, Opening

A, B, BASE = "jobs.fair.0", "jobs.fair.1", "jobs"


def consumed(p: ShardPrefetch) -> dict[str, int]:
    return {q: p.limit_for(q) for q in (A, B, BASE)}


def test_each_shard_consumes_with_what_the_worker_can_start_plus_one_and_a_base_queue_without():
    p = ShardPrefetch(narrow=5)
    assert consumed(p) == {A: 5, B: 5, BASE: 0}
    assert p.observe(opening=0, eta={}) == []


def test_a_blocked_idle_slot_opens_every_shard_sweep_by_sweep_and_they_close_after_settling():
    p, opening = ShardPrefetch(narrow=5), Opening(most=1000)

    def sweep(blocked: bool) -> list[str]:
        opening.observe(blocked)
        changed = sorted(p.observe(opening=opening.extra, eta={}))
        for queue in changed:  # consumed again, with its new window
            p.limit_for(queue)
        return changed

    consumed(p)
    # Each sweep that finds a process idle that no held job can take doubles every shard's
    # opening (a fleet-wide cap full for a moment takes in a chunk, not fair_max_held),
    assert sweep(True) == [A, B]
    assert consumed(p) == {A: 5 + CHUNK, B: 5 + CHUNK, BASE: 0}
    assert sweep(True) == [A, B]
    assert consumed(p) == {A: 5 + 2 * CHUNK, B: 5 + 2 * CHUNK, BASE: 0}
    # one calm sweep is not enough to close them (a slot may free and block again at once),
    for _ in range(SETTLE - 1):
        assert sweep(False) == []
    # a blocked sweep starts the count again (and opens further),
    assert sweep(True) == [A, B]
    for _ in range(SETTLE - 1):
        assert sweep(False) == []
    # and SETTLE calm sweeps in a row close them.
    assert sweep(False) == [A, B]
    assert consumed(p) == {A: 5, B: 5, BASE: 0}
    # However long it stays blocked, it opens to fair_max_held at most.
    for _ in range(12):
        sweep(True)
    assert consumed(p) == {A: 5 + 1000, B: 5 + 1000, BASE: 0}


def test_eta_tasks_waiting_in_a_shard_grow_its_window_in_chunks_and_only_its_own():
    p = ShardPrefetch(narrow=5)
    consumed(p)
    assert p.observe(opening=0, eta={A: 1, BASE: 40}) == [A]
    assert consumed(p) == {A: 5 + CHUNK, B: 5, BASE: 0}
    # more ETA tasks within the chunk change nothing; one past it grows it by a chunk,
    assert p.observe(opening=0, eta={A: CHUNK}) == []
    assert p.observe(opening=0, eta={A: CHUNK + 1}) == [A]
    assert p.limit_for(A) == 5 + 2 * CHUNK
    # and once they are due, it shrinks back.
    assert p.observe(opening=0, eta={}) == [A]
    assert p.limit_for(A) == 5


def test_stragglers_held_from_a_shard_open_it_past_them_in_few_doublings_and_it_closes_after():
    p = ShardPrefetch(narrow=5)
    consumed(p)
    # The window holds 5 stragglers of a key that has its lane now (128 more wait behind, and
    # light keys behind them): it opens by twice that, rounded up to a power of two,
    assert p.observe(opening=0, eta={}, stragglers={0: 5}) == [A]
    assert consumed(p) == {A: 5 + 16, B: 5, BASE: 0}
    # so each change reads past twice as many as the last: a few changes for any number,
    changes, held = 0, 5
    while held < 133:
        held = p.limit_for(A)  # the broker fills the wider window with more of them
        changes += len(p.observe(opening=0, eta={}, stragglers={0: min(held, 133)}))
    assert changes <= 4
    assert p.limit_for(A) >= 133 + 5  # room past them: the light keys' messages come in
    # and once they have started (none held), it closes again.
    assert p.observe(opening=0, eta={}, stragglers={}) == [A]
    assert p.limit_for(A) == 5


def test_a_new_narrow_width_follows_the_worker_and_forgotten_queues_stay_forgotten():
    p = ShardPrefetch(narrow=5)
    consumed(p)
    p.forget(B)
    p.narrow = 7  # autoscale, or a deeper reserve
    assert p.observe(opening=0, eta={}) == [A]
    assert p.info() == {A: 5}
    assert p.limit_for(A) == 7


def test_the_windows_widen_with_the_reserve_at_once_and_narrow_only_once_it_stays_shallower():
    # The reserve's depth moves what the worker can start up and down every second with short
    # jobs; each change of a window consumes every shard and lane again (round trips).
    p = ShardPrefetch(narrow=4)
    consumed(p)
    p.aim(11, now=0.0)  # deeper: at once
    assert p.observe(opening=0, eta={}) == [A, B]
    consumed(p)
    # shallower for a moment, and deeper again: nothing to consume again,
    for t, narrow in enumerate([4, 5, 11, 6, 4, 10, 11, 5]):
        p.aim(narrow, now=0.5 * t)
        assert p.observe(opening=0, eta={}) == []
    # until it stays below for NARROW_AFTER: then to the most it was meanwhile.
    p.aim(11, now=9.0)
    p.aim(5, now=10.0)
    p.aim(6, now=10.0 + NARROW_AFTER / 2)
    assert p.narrow == 11
    p.aim(4, now=10.0 + NARROW_AFTER)
    assert p.narrow == 6
    assert sorted(p.observe(opening=0, eta={})) == [A, B]
    assert consumed(p) == {A: 6, B: 6, BASE: 0}
