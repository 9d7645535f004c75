"""Rate limits by fairness key (``rate``, ``burst``, ``per`` in ``fair_keys``) over a fleet of
real ``celery worker -P fair`` processes sharing one Redis store: the fleet starts no more of a
key's jobs than its bucket pays for, while other keys' jobs take every slot it leaves, and a
rate charged by cost gives keys of cheap and dear jobs the same slot-time."""

from __future__ import annotations

from harness import intervals, wait_until
from test_fleet import fleet_conf, start_fleet


def _busy(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Slot-seconds the ``spans`` spent between ``start`` and ``end``."""
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


def test_a_key_at_5_a_second_starts_no_more_than_its_bucket_pays_for_across_the_fleet(
    make_run, start_worker, broker
):
    # Given two workers with 4 slots between them (nothing admitted ahead of a free process,
    # so a job starts when the store admits it), and tenant A limited to 5 jobs a second with
    # a burst of 5,
    conf = fleet_conf(broker, fair_keys={"A": {"rate": "5/s", "burst": 5}}, fair_lookahead=0)
    run = make_run(conf=conf)
    clone = run.app.tasks["fairapp.clone"]
    # when A publishes 65 short jobs and B 170 jobs of 0.3 s, before any worker runs (both
    # wait from the first start),
    for i in range(65):
        clone.apply_async([f"A{i}", 0.02], fairness_key="A", job_id=f"a{i}")
    for i in range(170):
        clone.apply_async([f"B{i}", 0.3], fairness_key="B", job_id=f"b{i}")
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 235, 120, "all 235 jobs")
    spans = intervals(run.recorder.events())
    a = sorted(s for tag, (s, _) in spans.items() if tag.startswith("A"))
    # then in any 10 s window the fleet started at most 5 x 10 + 5 of A's jobs (+1: a start is
    # recorded a few milliseconds after the store admitted it, and a window of recorded starts
    # may take in that much of an admission's neighbour),
    most = max(sum(1 for t in a[i:] if t <= t0 + 10.0) for i, t0 in enumerate(a))
    assert most <= 56, most
    # and A ran at its rate, not slower: its 60 jobs past the burst took about 12 s;
    took = a[-1] - a[0]
    assert 10.5 <= took <= 15.0, took
    # while B's jobs kept the slots A left busy: 90% of the fleet's slot-time while A ran, from
    # when both workers ran (a loaded host may start the second one seconds after the first).
    events = run.recorder.events()
    firsts: dict[int, float] = {}
    for e in events:
        if e["event"] == "start":
            firsts[e["ppid"]] = min(e["t"], firsts.get(e["ppid"], e["t"]))
    assert len(firsts) == 2
    up = max(max(firsts.values()), a[0])
    assert a[-1] - up >= 5, (up, a)
    used = _busy(list(spans.values()), up, a[-1])
    assert used >= 0.9 * 4 * (a[-1] - up), (used, a[-1] - up)


def test_a_rate_charged_by_cost_gives_dear_and_cheap_jobs_the_same_slot_time(
    make_run, start_worker, broker
):
    # Given two workers with 4 slots, a rate charged by cost (each key may start one second of
    # estimated work a second, banking up to two: a worker that wakes a little late on a
    # loaded host loses none of the refill), and estimates learned at once (fair_alpha 1),
    rate = {"rate": "1/s", "burst": 2, "per": "cost"}
    conf = fleet_conf(broker, fair_keys={"dear": rate, "cheap": rate}, fair_alpha=1.0)
    run = make_run(conf=conf)
    even = run.app.tasks["fairapp.even"]
    workers = start_fleet(run, start_worker, n=2)
    # once the store has learned what a job of each resource takes (0.5 s and 0.05 s),
    even.apply_async(["warm-dear", 0.5], fairness_key="warm", job_id="dear")
    even.apply_async(["warm-cheap", 0.05], fairness_key="warm", job_id="cheap")
    wait_until(lambda: len(run.recorder.done_counts()) == 2, 60, "the warm-up")
    # when "dear" publishes 28 jobs of 0.5 s and "cheap" 280 of 0.05 s while no worker runs
    # (both wait from the first start),
    for worker in workers:
        worker.stop()
    for i in range(28):
        even.apply_async([f"dear{i}", 0.5], fairness_key="dear", job_id="dear")
    for i in range(280):
        even.apply_async([f"cheap{i}", 0.05], fairness_key="cheap", job_id="cheap")
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 310, 120, "all 308 jobs")
    # then over the first 10 s each used about a second of slot-time a second, plus its burst
    # (equal slot-time within 15%), so cheap started about ten jobs for each of dear's.
    spans = {t: s for t, s in intervals(run.recorder.events()).items() if "warm" not in t}
    begin = min(s for s, _ in spans.values())
    dear = [span for tag, span in spans.items() if tag.startswith("dear")]
    cheap = [span for tag, span in spans.items() if tag.startswith("cheap")]
    used = {"dear": _busy(dear, begin, begin + 10), "cheap": _busy(cheap, begin, begin + 10)}
    assert 0.85 <= used["dear"] / used["cheap"] <= 1.15, used
    assert 8.0 <= used["dear"] <= 13.0, used
    counts = {
        k: sum(1 for s, _ in v if s < begin + 10) for k, v in (("dear", dear), ("cheap", cheap))
    }
    assert 7 <= counts["cheap"] / counts["dear"] <= 13, counts
