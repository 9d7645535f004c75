"""The prefetch window (worker/window.py) on Kombu's own QoS object."""

from __future__ import annotations

from kombu.common import QoS

from celery_fair.worker.window import CHUNK, PrefetchWindow

CELERYS = 4  # concurrency x worker_prefetch_multiplier


def window(max_held: int = 1000, sent: list[int] | None = None) -> tuple[PrefetchWindow, QoS]:
    """A window over a QoS whose ``basic.qos`` calls (one per change applied) go to ``sent``."""
    qos = QoS(
        lambda prefetch_count: (sent if sent is not None else []).append(prefetch_count), CELERYS
    )
    return PrefetchWindow(lambda: qos, max_held), qos


def test_nothing_fair_inside_leaves_celerys_window_alone():
    w, qos = window()
    w.follow(held=0, fair_inside=False)
    w.sweep(fair_inside=False)
    assert qos.value == CELERYS


def test_fair_work_opens_a_chunk_and_the_window_stays_ahead_of_what_is_held():
    w, qos = window()
    w.follow(held=0, fair_inside=True)  # a fair job runs: room for the next message
    assert qos.value == CELERYS + CHUNK
    for held in range(1, 200):
        w.follow(held=held, fair_inside=True)
        assert held + 1 <= qos.value - CELERYS <= max(CHUNK, 2 * (held + 1) + 16)


def test_it_moves_in_chunks_not_per_message():
    sent: list[int] = []
    w, qos = window(sent=sent)
    for held in [*range(100), *range(100, 0, -1)]:  # as Celery's loop applies changes
        w.follow(held=held, fair_inside=True)
        if qos.prev != qos.value:
            qos.update()
    assert 0 < len(sent) < 20


def test_it_stops_at_max_held():
    w, qos = window(max_held=50)
    w.follow(held=500, fair_inside=True)
    assert qos.value == CELERYS + 51


def test_the_raise_is_given_back_after_a_whole_sweep_interval_without_fair_work():
    w, qos = window()
    w.follow(held=3, fair_inside=True)
    w.follow(held=0, fair_inside=False)  # the last one ended just now
    w.sweep(fair_inside=False)  # fair work was inside during this interval: keep it
    assert qos.value > CELERYS
    w.sweep(fair_inside=False)  # a whole interval without: give it back
    assert qos.value == CELERYS
    assert w.raised == 0


def test_a_new_connection_starts_from_celerys_value():
    w, _ = window()
    w.follow(held=10, fair_inside=True)
    w.reset()
    fresh = QoS(lambda prefetch_count: None, CELERYS)
    w._qos = lambda: fresh
    w.follow(held=10, fair_inside=True)
    assert fresh.value - CELERYS >= 11


def test_a_limit_bounds_the_window_and_lifting_it_lets_it_grow_to_max_held():
    # Given a gate that would take in a whole burst,
    w, qos = window(max_held=1000)
    # when it holds what its limit allows (shards: what it can start, plus a look at each),
    w.follow(held=12, fair_inside=True, limit=12)
    # then the window stays one place ahead of the limit and no further,
    assert qos.value == CELERYS + 13
    w.follow(held=13, fair_inside=True, limit=12)
    assert qos.value == CELERYS + 13
    # it grows while the limit is lifted (a pool process idles that no held job can take),
    for held in range(13, 300):
        w.follow(held=held, fair_inside=True, limit=1000)
    assert qos.value - CELERYS > 300
    # and it comes back to the limit once it is set again.
    w.follow(held=40, fair_inside=True, limit=12)
    assert qos.value == CELERYS + 13
