"""Runtime policies on a fleet of real ``celery worker -P fair`` processes, changed with
``celery -A fairapp fair pause|resume|weights`` while they run (both brokers, the Redis store)."""

from __future__ import annotations

import json

import pytest
from harness import gate_stats, intervals, max_overlap, wait_until
from test_fair_command import fair_command
from test_fleet import fleet_conf, start_fleet

from celery_fair import fair_headers
from celery_fair.control import status


@pytest.mark.parametrize("what", ["key", "tenant"])
def test_pausing_a_key_or_tenant_holds_its_jobs_and_resuming_runs_each_once(
    make_run, start_worker, broker, what
):
    # Given two workers, and key acme paused from the command line (or with two-level keys,
    # tenant acme, whose jobs come from its ten keys acme/0 to acme/9),
    two_level = {"fair_key_separator": "/"} if what == "tenant" else {}
    run = make_run(conf=fleet_conf(broker, **two_level))
    workers = start_fleet(run, start_worker, n=2, concurrency=2)
    out = fair_command(run, "pause", f"--{what}", "acme")
    assert out.returncode == 0, out.stderr
    assert f"paused {what}s: acme" in out.stdout
    clone = run.app.tasks["fairapp.clone"]
    # when acme and bob each publish 10 jobs (within a second of the pause: the store refuses
    # acme's jobs even to a worker whose beat has not brought the pause yet),
    acme = []
    for i in range(10):
        key = "acme" if what == "key" else f"acme/{i}"
        acme.append(clone.apply_async([f"acme{i}", 0.05], fairness_key=key))
        clone.apply_async([f"bob{i}", 0.05], fairness_key="bob")
    # then bob's all run, and acme's wait, held by the workers as paused,
    wait_until(
        lambda: sum(n for t, n in run.recorder.done_counts().items() if t.startswith("bob")) == 10,
        60,
        "bob's 10 jobs",
    )

    def paused_held() -> int:
        return sum(gate_stats(run, w).get("fair-blocked-paused", 0) for w in workers)

    wait_until(lambda: paused_held() == 10, 30, "acme's 10 jobs held as paused")
    assert not any(t.startswith("acme") for t in run.recorder.done_counts())
    # with no expected start, but what they wait for (not "about 0.0 s": nothing runs),
    found = status(run.app, acme[-1].id)
    assert (found["state"], found["expected_wait"]) == ("held", None), found
    assert found["waits_for"] == f"paused ({what} 'acme')"
    shown = fair_command(run, "job", acme[-1].id)
    said = f"; no expected start, it waits on: paused ({what} 'acme')"
    assert said in shown.stdout, shown.stdout
    assert "expected to start in about" not in shown.stdout
    # and once resumed, each of acme's runs exactly once.
    out = fair_command(run, "resume", f"--{what}", "acme")
    assert out.returncode == 0, out.stderr
    assert "paused keys: none" in out.stdout
    assert "paused tenants" not in out.stdout
    wait_until(lambda: len(run.recorder.done_counts()) == 20, 60, "all 20 jobs")
    assert run.recorder.done_counts() == {f"{k}{i}": 1 for k in ("acme", "bob") for i in range(10)}
    starts = [e for e in run.recorder.events() if e["event"] == "start"]
    assert len(starts) == 20


def test_a_cap_set_at_run_time_holds_across_the_fleet_and_a_reset_lifts_it(
    make_run, start_worker, broker
):
    # Given two workers with 4 slots, and acme capped at 1 from the command line,
    run = make_run(conf=fleet_conf(broker))
    start_fleet(run, start_worker, n=2, concurrency=2)
    out = fair_command(run, "weights", "acme", "--max-concurrency", "1", "--weight", "2")
    assert out.returncode == 0, out.stderr
    assert "acme: max_concurrency=1, weight=2.0" in out.stdout
    clone = run.app.tasks["fairapp.clone"]
    # when acme publishes 8 jobs (after a beat: a cap reaches workers with their next beat),
    wait_until(lambda: _policy_seen(run), 10, "the workers' beat")
    for i in range(8):
        clone.apply_async([f"acme{i}", 0.2], fairness_key="acme")
    wait_until(lambda: len(run.recorder.done_counts()) == 8, 60, "acme's 8 jobs")
    # then they ran one at a time, on both workers' slots;
    spans = intervals(run.recorder.events())
    assert max_overlap(list(spans.values())) == 1
    # once reset, they run side by side again.
    out = fair_command(run, "weights", "acme", "--reset")
    assert out.returncode == 0, out.stderr
    assert "acme:" not in out.stdout
    wait_until(lambda: _policy_seen(run), 10, "the workers' beat")
    run.recorder.clear()
    for i in range(8):
        clone.apply_async([f"again{i}", 0.2], fairness_key="acme")
    wait_until(lambda: len(run.recorder.done_counts()) == 8, 60, "acme's next 8 jobs")
    assert max_overlap(list(intervals(run.recorder.events()).values())) >= 3


def test_weights_shows_fair_keys_under_the_runtime_entries_and_one_keys_sources(make_run, broker):
    # Given fair_keys with a pattern's cap and a minimum (the command reads the store only),
    run = make_run(
        conf=fleet_conf(
            broker, fair_keys={"tenant:*": {"max_concurrency": 4}, "ops": {"min_slots": 2}}
        )
    )
    # `fair weights` lists them, though nothing was set at run time;
    out = fair_command(run, "weights")
    assert out.returncode == 0, out.stderr
    assert "  tenant:*: max_concurrency=4 (fair_keys)" in out.stdout
    assert "  ops: min_slots=2 (fair_keys)" in out.stdout
    # `fair weights KEY` gives a key's policy and where each value comes from;
    out = fair_command(run, "weights", "tenant:acme")
    assert out.returncode == 0, out.stderr
    assert "tenant:acme: fair_keys entry 'tenant:*'" in out.stdout
    assert "  max_concurrency: 4 (fair_keys 'tenant:*')" in out.stdout
    assert "  weight: 1.0 (default)" in out.stdout
    # and once tenant:acme gets a weight of its own at run time, its entry replaces the pattern
    # for it: the weight is the runtime one and the pattern's cap no longer applies.
    out = fair_command(run, "weights", "tenant:acme", "--weight", "3")
    assert out.returncode == 0, out.stderr
    assert "  tenant:acme: weight=3.0 (runtime)" in out.stdout
    out = fair_command(run, "weights", "tenant:acme", "--json")
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert (found["entry"], found["from"]) == ("tenant:acme", "runtime")
    assert found["policy"] == {
        "weight": 3.0,
        "min_slots": 0,
        "max_concurrency": None,
        "max_priority": None,
        "rate": None,
        "burst": None,
        "per": "job",
    }
    assert found["sources"] == {
        "weight": "runtime",
        "min_slots": "default",
        "max_concurrency": "default",
        "max_priority": "default",
        "rate": "default",
        "burst": "default",
        "per": "default",
    }
    # A rate set at run time shows per second, where it comes from, and a bad one is refused
    # with the reason, changing nothing.
    out = fair_command(run, "weights", "api", "--rate", "600/m", "--burst", "40", "--per", "cost")
    assert out.returncode == 0, out.stderr
    out = fair_command(run, "weights", "api")
    assert "  rate: 10/s (runtime 'api')" in out.stdout, out.stdout
    assert "  burst: 40.0 (runtime 'api')" in out.stdout, out.stdout
    assert "  per: cost (runtime 'api')" in out.stdout, out.stdout
    out = fair_command(run, "weights", "api", "--rate", "10/x")
    assert out.returncode != 0
    assert "rate must be like '10/s'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    out = fair_command(run, "weights", "api", "--json")
    assert json.loads(out.stdout)["policy"]["rate"] == 10.0


def _policy_seen(run) -> bool:
    """Every worker's engine has the store's runtime policies' version (inspect stats)."""
    from test_fleet import store_of

    store = store_of(run)
    try:
        version, _ = store.policies()
    finally:
        store.close()
    stats = run.app.control.inspect(timeout=1).stats() or {}
    seen = [s.get("pool", {}).get("fair-policies-version") for s in stats.values()]
    return bool(seen) and all(v == version for v in seen)


def test_a_paused_key_is_returned_to_the_broker_once_not_round_and_round(
    make_run, start_worker, broker
):
    # Given a worker that may hold 4 messages and returns blocking ones every 0.3 s, with
    # tenant acme paused,
    run = make_run(conf=fleet_conf(broker, fair_max_held=4, fair_spill_interval=0.3))
    worker = start_worker(run, concurrency=1)
    out = fair_command(run, "pause", "--key", "acme")
    assert out.returncode == 0, out.stderr
    # when 12 of acme's jobs and then one of bob's are published to the queue,
    for i in range(12):
        run.send("fairapp.counted", f"acme{i}", 0.01, headers=fair_headers("clone", "acme"))
    run.send("fairapp.counted", "bob", 0.01, headers=fair_headers("clone", "bob"))
    # then paused jobs go back to the broker so that bob's runs,
    wait_until(lambda: run.recorder.done_counts().get("bob"), 30, "bob's job")
    # the worker then holds the paused ones it has for seconds, returning none a second time
    # (each would only come back),
    wait_until(
        lambda: gate_stats(run, worker).get("fair-oldest-held-seconds", 0) >= 3,
        30,
        "a paused job held for 3 s",
    )
    # and after the resume every job ran once, none of them returned twice.
    assert fair_command(run, "resume", "--key", "acme").returncode == 0
    wait_until(lambda: len(run.recorder.done_counts()) == 13, 60, "all 13 jobs")
    assert set(run.recorder.done_counts().values()) == {1}
    trips = [e["republished"] for e in run.recorder.events() if e["event"] == "start"]
    assert max(trips) <= 1, trips
    assert gate_stats(run, worker)["fair-spilled"] <= 12


def test_pausing_a_tenant_with_flat_keys_is_refused_and_changes_nothing(make_run, broker):
    run = make_run(conf=fleet_conf(broker))
    out = fair_command(run, "pause", "--tenant", "acme")
    assert out.returncode != 0
    assert "--tenant needs two-level keys (fair_key_separator)" in out.stderr, out.stderr
    shown = fair_command(run, "weights")
    assert shown.returncode == 0, shown.stderr
    assert "paused tenants" not in shown.stdout
