"""Policies by fairness key (``fair_keys``) over a fleet of real ``celery worker -P fair``
processes sharing one Redis store: a key's cap counts every worker's jobs, and a key's weight
is its share of the slots."""

from __future__ import annotations

from harness import intervals, max_overlap, wait_until
from test_fleet import fleet_conf, start_fleet, store_of


def test_a_key_capped_at_2_never_runs_more_than_2_across_the_fleet(make_run, start_worker, broker):
    # Given three workers with 6 slots between them, and tenant "acme" capped at 2,
    run = make_run(conf=fleet_conf(broker, fair_keys={"acme": {"max_concurrency": 2}}))
    start_fleet(run, start_worker)
    clone = run.app.tasks["fairapp.clone"]
    # when acme publishes 10 jobs and two other tenants 8 each, all at once (0.6 s each: long
    # enough that a worker slowed down by a busy machine still overlaps the others),
    for i in range(10):
        clone.apply_async([f"acme{i}", 0.6], fairness_key="acme", job_id=f"a{i}")
    for i in range(8):
        clone.apply_async([f"bob{i}", 0.6], fairness_key="bob", job_id=f"b{i}")
        clone.apply_async([f"cid{i}", 0.6], fairness_key="cid", job_id=f"c{i}")
    wait_until(lambda: len(run.recorder.done_counts()) == 26, 90, "all 26 jobs")
    # then acme ran 2 at a time at most, and reached 2, on more than one worker,
    events = run.recorder.events()
    spans = intervals(events)
    assert max_overlap([s for tag, s in spans.items() if tag.startswith("acme")]) == 2
    acme_workers = {e["ppid"] for e in events if e["event"] == "start" and "acme" in e["tag"]}
    assert len(acme_workers) >= 2
    # while the others used the rest of the slots,
    assert max_overlap(list(spans.values())) >= 5
    # and nothing is left counted in the store (a job's end reaches the store just after the
    # job recorded it: poll).
    store = store_of(run)
    wait_until(
        lambda: store.heartbeat("probe", [], ["acme"]).keys == {}, 10, "acme's count to clear"
    )
    store.close()


def test_weights_3_and_1_share_the_slots_3_to_1_across_the_fleet(make_run, start_worker, broker):
    # Given two workers with 4 slots between them, "big" of weight 3 and "small" of weight 1,
    run = make_run(conf=fleet_conf(broker, fair_keys={"big": {"weight": 3}}))
    warm = start_fleet(run, start_worker, n=2)
    clone = run.app.tasks["fairapp.clone"]
    # once the type's estimate has learned what a job takes (its default cost is 1 s: charged
    # that, the first jobs would tilt the costs for a while, whatever the weights),
    for i in range(20):
        clone.apply_async([f"warm{i}", 0.05], fairness_key="warm")
    wait_until(lambda: len(run.recorder.done_counts()) == 20, 60, "the warm-up")
    # when both have more waiting than the slots can run (big 300, small 100, 50 ms each:
    # published while no worker runs, so that both wait from the first start however slowly
    # a loaded host publishes; the store keeps the learned estimate),
    for worker in warm:
        worker.stop()
    for i in range(300):
        clone.apply_async([f"big{i}", 0.05], fairness_key="big")
    for i in range(100):
        clone.apply_async([f"small{i}", 0.05], fairness_key="small")
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 420, 120, "all 400 jobs")
    # then while both had work waiting (the first 200 starts), big got 3 slot-times for each
    # of small's, within 10%.
    spans = intervals(run.recorder.events())
    spans = {tag: span for tag, span in spans.items() if not tag.startswith("warm")}
    first = sorted(spans.items(), key=lambda item: item[1][0])[:200]
    used = {"big": 0.0, "small": 0.0}
    for tag, (start, end) in first:
        used["big" if tag.startswith("big") else "small"] += end - start
    ratio = used["big"] / used["small"]
    assert 2.7 <= ratio <= 3.3, (ratio, used)


def test_with_priority_scope_key_tenants_at_priority_9_and_1_share_the_slots_by_weight(
    make_run, start_worker, broker
):
    # Given two workers with 4 slots between them, priorities ordering only a key's own jobs,
    # and tiers 9 and 1 declared without caps (the cap of tier 1 would be 1),
    conf = fleet_conf(broker, fair_priority_scope="key", fair_tier_caps={9: None, 1: None})
    run = make_run(conf=conf)
    even = run.app.tasks["fairapp.even"]  # charged its real cost from the first job
    # when tenant A publishes 150 jobs at priority 9 and tenant B 150 at priority 1, 50 ms
    # each, before any worker runs (both wait from the first start),
    for i in range(150):
        even.apply_async([f"A{i}", 0.05], fairness_key="A", fair_priority=9)
    for i in range(150):
        even.apply_async([f"B{i}", 0.05], fairness_key="B", fair_priority=1)
    start_fleet(run, start_worker, n=2)
    wait_until(lambda: len(run.recorder.done_counts()) == 300, 120, "all 300 jobs")
    # then while both had work waiting (the first 150 starts), each got half the slot-time,
    # within 10% (with the default "global" scope, A would have had them all).
    spans = intervals(run.recorder.events())
    first = sorted(spans.items(), key=lambda item: item[1][0])[:150]
    used = {"A": 0.0, "B": 0.0}
    for tag, (start, end) in first:
        used[tag[0]] += end - start
    share = used["A"] / (used["A"] + used["B"])
    assert 0.45 <= share <= 0.55, (share, used)
