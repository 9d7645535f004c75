"""Each shard's own window on RabbitMQ (worker/consumer_prefetch.py): narrow while work flows,
wide while held work blocks an idle slot, grown by the ETA tasks a shard has waiting."""

from __future__ import annotations

from celery_fair.worker.consumer_prefetch import SETTLE, ShardPrefetch
from celery_fair.worker.window import CHUNK

A, B, BASE = "jobs.fair.0", "jobs.fair.1", "jobs"


def consumed(p: ShardPrefetch) -> dict[str, int]:
    return {q: p.limit_for(q) for q in (A, B, BASE)}


def test_each_shard_consumes_with_what_the_worker_can_start_plus_one_and_a_base_queue_without():
    p = ShardPrefetch(narrow=5, wide=1001)
    assert consumed(p) == {A: 5, B: 5, BASE: 0}
    assert p.observe(blocked_idle=False, eta={}) == []


def test_a_blocked_idle_slot_opens_every_shard_at_once_and_they_close_after_settling():
    p = ShardPrefetch(narrow=5, wide=1001)
    consumed(p)
    assert sorted(p.observe(blocked_idle=True, eta={})) == [A, B]
    assert consumed(p) == {A: 1001, B: 1001, BASE: 0}
    # one calm sweep is not enough (a slot may free and block again at once),
    for _ in range(SETTLE - 1):
        assert p.observe(blocked_idle=False, eta={}) == []
    # a blocked sweep starts the count again,
    assert p.observe(blocked_idle=True, eta={}) == []
    for _ in range(SETTLE - 1):
        assert p.observe(blocked_idle=False, eta={}) == []
    # and SETTLE calm sweeps in a row close them.
    assert sorted(p.observe(blocked_idle=False, eta={})) == [A, B]
    assert consumed(p) == {A: 5, B: 5, BASE: 0}


def test_eta_tasks_waiting_in_a_shard_grow_its_window_in_chunks_and_only_its_own():
    p = ShardPrefetch(narrow=5, wide=1001)
    consumed(p)
    assert p.observe(blocked_idle=False, eta={A: 1, BASE: 40}) == [A]
    assert consumed(p) == {A: 5 + CHUNK, B: 5, BASE: 0}
    # more ETA tasks within the chunk change nothing; one past it grows it by a chunk,
    assert p.observe(blocked_idle=False, eta={A: CHUNK}) == []
    assert p.observe(blocked_idle=False, eta={A: CHUNK + 1}) == [A]
    assert p.limit_for(A) == 5 + 2 * CHUNK
    # and once they are due, it shrinks back.
    assert p.observe(blocked_idle=False, eta={}) == [A]
    assert p.limit_for(A) == 5


def test_stragglers_held_from_a_shard_open_it_past_them_in_few_doublings_and_it_closes_after():
    p = ShardPrefetch(narrow=5, wide=1001)
    consumed(p)
    # The window holds 5 stragglers of a key that has its lane now (128 more wait behind, and
    # light keys behind them): it opens by twice that, rounded up to a power of two,
    assert p.observe(blocked_idle=False, eta={}, stragglers={0: 5}) == [A]
    assert consumed(p) == {A: 5 + 16, B: 5, BASE: 0}
    # so each change reads past twice as many as the last: a few changes for any number,
    changes, held = 0, 5
    while held < 133:
        held = p.limit_for(A)  # the broker fills the wider window with more of them
        changes += len(p.observe(blocked_idle=False, eta={}, stragglers={0: min(held, 133)}))
    assert changes <= 4
    assert p.limit_for(A) >= 133 + 5  # room past them: the light keys' messages come in
    # and once they have started (none held), it closes again.
    assert p.observe(blocked_idle=False, eta={}, stragglers={}) == [A]
    assert p.limit_for(A) == 5


def test_a_new_narrow_width_follows_the_worker_and_forgotten_queues_stay_forgotten():
    p = ShardPrefetch(narrow=5, wide=1001)
    consumed(p)
    p.forget(B)
    p.narrow = 7  # autoscale, or a deeper reserve
    assert p.observe(blocked_idle=False, eta={}) == [A]
    assert p.info() == {A: 5}
    assert p.limit_for(A) == 7
