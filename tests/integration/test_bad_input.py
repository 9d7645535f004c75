"""Bad fairness headers never crash the worker: one log line each, and the documented outcome."""

from __future__ import annotations

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
