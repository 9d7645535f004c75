"""Two-level keys (``fair_key_separator``) on real ``celery worker -P fair`` processes: a tenant
that spreads its backlog over ten keys gets one tenant's share of the slots, not ten, on one
worker and across a fleet sharing one store (issue 34, part 2)."""

from __future__ import annotations

import pytest
from harness import intervals, wait_until
from test_fleet import fleet_conf, start_fleet

JOBS = 300  # per tenant
SECONDS = 0.1  # each job's run: every job costs the same (fairapp.even's default cost too)


def slot_time_share(spans: dict[str, tuple[float, float]], prefix: str, window: int) -> float:
    """``prefix``'s share of the slot-time used from the first start to the ``window``-th."""
    ordered = sorted(spans.values())
    begin, end = ordered[0][0], ordered[window - 1][0]
    used = {True: 0.0, False: 0.0}
    for tag, (start, stop) in spans.items():
        part = min(stop, end) - max(start, begin)
        if part > 0:
            used[tag.startswith(prefix)] += part
    return used[True] / (used[True] + used[False])


@pytest.mark.parametrize(
    ("workers", "slots", "separator"),
    [(1, 4, "/"), (3, 2, "/"), (1, 4, None)],
    ids=["one worker", "three workers", "flat keys"],
)
def test_a_tenant_on_ten_keys_and_a_tenant_on_one_share_the_slots_half_and_half(
    make_run, start_worker, broker, workers, slots, separator
):
    # Given running fair workers (one of 4 slots, or three of 2 sharing a store), and the key
    # separator "/" (or, to compare, flat keys),
    conf = fleet_conf(broker) if separator is None else fleet_conf(broker, fair_key_separator="/")
    run = make_run(conf=conf)
    start_fleet(run, start_worker, n=workers, concurrency=slots)
    even = run.app.tasks["fairapp.even"]
    # when tenant S publishes its backlog under ten keys and tenant T under one, both at
    # once, faster than the slots run them (jobs of 100 ms, the same cost for both),
    for i in range(JOBS):
        even.apply_async([f"S/{i % 10}/{i}", SECONDS], fairness_key=f"S/{i % 10}")
        even.apply_async([f"T/{i}", SECONDS], fairness_key="T")
    wait_until(lambda: len(run.recorder.done_counts()) == 2 * JOBS, 120, "every job")
    # then while both had jobs waiting (the first two thirds of the starts: at half and half
    # each still has a third of its backlog then), T used half the slot-time, within 10%;
    # with flat keys, about one share in eleven (shown over the first 250 starts).
    spans = intervals(run.recorder.events())
    order = "".join(tag[0] for _, tag in sorted((s, tag) for tag, (s, _) in spans.items()))
    if separator is None:  # (S's keys run out after about 330 starts at ten in eleven)
        share = slot_time_share(spans, "T/", window=JOBS * 5 // 6)
        assert share < 0.15, (share, order)
    else:
        share = slot_time_share(spans, "T/", window=JOBS * 4 // 3)
        assert 0.45 <= share <= 0.55, (share, order)
