"""Bad fairness headers never crash the worker: one log line each, and the documented outcome."""

from __future__ import annotations

import json

from harness import wait_until

from celery_fair import fair_headers


def dead_letters(run, expected: int) -> list[dict]:
    with run.app.connection_for_read() as conn:
        queue = conn.SimpleQueue(run.dead_letter)
        messages = []
        for _ in range(expected):
            message = queue.get(timeout=10)
            messages.append(message.headers)
            message.ack()
        queue.close()
    return messages


def test_bad_headers_are_repaired_or_dead_lettered_and_the_worker_keeps_going(
    make_run, start_worker
):
    run = make_run()
    worker = start_worker(run, concurrency=2)
    good = fair_headers("clone", "k", "ok")
    run.send("fairapp.clone", "int-key", 0.01, headers={**good, "fairness_key": 12345})
    run.send("fairapp.clone", "long-key", 0.01, headers={**good, "fairness_key": "x" * 1000})
    run.send("fairapp.clone", "nested-key", 0.01, headers={**good, "fairness_key": {"a": [1]}})
    run.send("fairapp.clone", "unknown-type", 0.01, headers={**good, "job_type": "nope"})
    run.send("fairapp.plain", "plain-unknown-type", 0.01, headers={"job_type": "nope"})
    run.send("fairapp.clone", "bad-job-id", 0.01, headers={**good, "job_id": ["a", "b"]})
    run.send("fairapp.clone", "bad-submitted", 0.01, headers={**good, "fair_submitted": "soon"})
    run.send("fairapp.clone", "after", 0.01, headers=good)
    repaired = {"int-key", "long-key", "nested-key", "unknown-type", "bad-submitted", "after"}
    wait_until(lambda: repaired <= set(run.recorder.done_counts()), 30, "the repaired jobs")
    rejected = dead_letters(run, 2)
    assert sorted(h["id"] is not None for h in rejected) == [True, True]
    errors = sorted(h["fair_error"] for h in rejected)
    assert errors[0].startswith("job_id: not a string")
    assert errors[1].startswith("job_type: unknown job type 'nope'")
    assert set(run.recorder.done_counts()) == repaired  # the rejected two never ran
    assert worker.log().count("has bad fairness headers") == 7


def test_reject_policy_sends_any_bad_message_to_the_dead_letter_queue(make_run, start_worker):
    run = make_run(conf={"fair_on_bad_message": "reject"})
    start_worker(run, concurrency=1)
    good = fair_headers("clone", "k", "ok")
    run.send("fairapp.clone", "int-key", 0.01, headers={**good, "fairness_key": 7})
    run.send("fairapp.clone", "after", 0.01, headers=good)
    wait_until(lambda: run.recorder.done_counts().get("after"), 30, "the good job")
    (rejected,) = dead_letters(run, 1)
    assert rejected["fair_error"].startswith("fairness_key: not a string")
    assert "int-key" not in run.recorder.done_counts()


def test_a_header_that_is_not_unicode_text_stops_neither_the_worker_nor_the_jobs_behind_it(
    make_run, start_worker
):
    # Given a fair worker with shards (the default) and a producer that knows nothing of
    # celery-fair, whose tenant names and resources come from a JSON API: a lone surrogate
    # is a str that travels through both brokers but that no encoder takes as UTF-8,
    run = make_run()
    worker = start_worker(run, concurrency=2)
    lone = json.loads('"\\ud800"')
    good = fair_headers("clone", "k", "ok")
    run.send("fairapp.clone", "lone-key", 0.01, headers={**good, "fairness_key": f"t-{lone}"})
    run.send("fairapp.clone", "lone-id", 0.01, headers={**good, "job_id": lone})
    free = fair_headers("snapshot", "k")
    run.send("fairapp.snapshot", "lone-id-free", 0.01, headers={**free, "job_id": lone})
    for i in range(3):
        run.send("fairapp.clone", f"after-{i}", 0.01, headers=fair_headers("clone", f"k{i}", "r"))
    # when the worker reads them, the key is repaired to the default key, the resource of a
    # type without a conflict group is dropped, the one of a type with a conflict group is
    # dead-lettered, and the jobs behind them run, on a worker that keeps running.
    expected = {"lone-key", "lone-id-free", "after-0", "after-1", "after-2"}
    wait_until(lambda: expected <= set(run.recorder.done_counts()), 30, "the jobs")
    (rejected,) = dead_letters(run, 1)
    assert rejected["fair_error"].startswith("job_id: not Unicode text")
    assert set(run.recorder.done_counts()) == expected
    assert worker.proc is not None
    assert worker.proc.poll() is None
    log = worker.log()
    assert "Unrecoverable error" not in log
    assert "store unreachable" not in log.lower()
    assert log.count("has bad fairness headers") == 3
