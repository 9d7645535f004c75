"""Rate limits by fairness key (``rate``, ``burst``, ``per`` in ``fair_keys``) over a fleet of
real ``celery worker -P fair`` processes sharing one Redis store: the fleet starts no more of a
key's jobs than its bucket pays for, while other keys' jobs take every slot it leaves, and a
rate charged by cost gives keys of cheap and dear jobs the same slot-time."""

from __future__ import annotations

import pytest
from harness import intervals, wait_until
from test_fleet import fleet_conf, start_fleet


def _busy(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Slot-seconds the ``spans`` spent between ``start`` and ``end``."""
    return sum(max(0.0, min(e, end) - max(s, start)) for s, e in spans)


@pytest.mark.parametrize("limited", ["key", "type", "tenant"])
def test_a_key_or_type_at_5_a_second_starts_no_more_than_its_bucket_pays_for_in_the_fleet(
    make_run, start_worker, broker, limited
):
    # Given two workers with 4 slots between them (nothing admitted ahead of a free process,
    # so a job starts when the store admits it), and limited to 5 jobs a second with a burst
    # of 5 either key A, or the type "export" (fairapp.py) whose jobs come from ten keys, or
    # with two-level keys tenant A, whose jobs come from its ten keys A/0 to A/9,
    keys = {"A": {"rate": "5/s", "burst": 5}} if limited in ("key", "tenant") else {}
    two_level = {"fair_key_separator": "/"} if limited == "tenant" else {}
    conf = fleet_conf(broker, fair_keys=keys, fair_lookahead=0, **two_level)
    run = make_run(conf=conf)
    clone = run.app.tasks["fairapp.clone"]
    export = run.app.tasks["fairapp.export"]
    # when A publishes 65 short jobs (clones of key A, exports of keys A0-A9, or clones of
    # keys A/0-A/9) and B 130 clones of 0.6 s (more than the 4 slots run while A does), before
    # any worker runs (both wait from the first start). (B's jobs are long enough that the
    # store's round trip before each start, which a loaded host stretches, is not what the
    # slots' idle time measures: 0.3 s jobs read 0.89 busy in one CI run beside the
    # property tests, 0.93-0.97 on the same host with six of these tests at once.)
    for i in range(65):
        if limited == "key":
            clone.apply_async([f"A{i}", 0.02], fairness_key="A", job_id=f"a{i}")
        elif limited == "tenant":
            clone.apply_async([f"A{i}", 0.02], fairness_key=f"A/{i % 10}", job_id=f"a{i}")
        else:
            export.apply_async([f"A{i}", 0.02], fairness_key=f"A{i % 10}", job_id=f"a{i}")
    for i in range(130):
        clone.apply_async([f"B{i}", 0.6], fairness_key="B", job_id=f"b{i}")
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 195, 120, "all 195 jobs")
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
    # while B's jobs kept the slots A left busy: 90% of the fleet's slot-time while A ran and B
    # had jobs waiting, from when both workers ran (a loaded host may start the second one
    # seconds after the first, and run B's backlog out before A's last start).
    events = run.recorder.events()
    firsts: dict[int, float] = {}
    for e in events:
        if e["event"] == "start":
            firsts[e["ppid"]] = min(e["t"], firsts.get(e["ppid"], e["t"]))
    assert len(firsts) == 2
    up = max(max(firsts.values()), a[0])
    end = min(a[-1], max(s for tag, (s, _) in spans.items() if tag.startswith("B")))
    assert end - up >= 5, (up, end, a)
    used = _busy(list(spans.values()), up, end)
    assert used >= 0.9 * 4 * (end - up), (used / (4 * (end - up)), used, end - up)


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
    # once the store has learned what a job of each resource takes (1 s and 0.1 s),
    even.apply_async(["warm-dear", 1.0], fairness_key="warm", job_id="dear")
    even.apply_async(["warm-cheap", 0.1], fairness_key="warm", job_id="cheap")
    wait_until(lambda: len(run.recorder.done_counts()) == 2, 60, "the warm-up")
    # when "dear" publishes 16 jobs of 1 s and "cheap" 160 of 0.1 s while no worker runs
    # (both wait from the first start). (Cheap's jobs are long enough that its rate asks for
    # 12 starts a second, not 24: at 0.05 s a loaded host's admissions could not keep up, and
    # cheap read 0.85 of dear's slot-time in one CI run beside the property tests.)
    for worker in workers:
        worker.stop()
    for i in range(16):
        even.apply_async([f"dear{i}", 1.0], fairness_key="dear", job_id="dear")
    for i in range(160):
        even.apply_async([f"cheap{i}", 0.1], fairness_key="cheap", job_id="cheap")
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 178, 120, "all 176 jobs")
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
