"""In-process foreground work (issue 22): ``with fair.slot(...)`` in separate processes goes
through the same scheduler as real ``celery worker -P fair`` processes: the same type caps and
conflicts, fleet-wide, on both brokers (the store is Redis either way: ``fleet_conf``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from harness import HERE, intervals, max_overlap, wait_until
from test_fleet import fleet_conf, start_fleet

from celery_fair import fair_headers

# A caller process: makes its scheduler (as a web server would, before any request), says it is
# ready and waits for the test's go, then runs a 0.2 s repack slot on each job id of argv[2] in
# turn, as fairness key argv[1], recording each block's start and end as the tasks do.
CALLER = """
import sys, time
import fairapp
import celery_fair as fair

name, job_ids = sys.argv[1], sys.argv[2].split(",")
rec = fairapp.Recorder(fairapp.os.environ["FAIRAPP_PREFIX"])
fair.slots.slot_scheduler(fairapp.app)
rec.redis.rpush(f"{rec.prefix}:ready", name)
rec.wait_released(f"go:{name}", 120)
for i, job_id in enumerate(job_ids):
    tag = f"slot:{job_id}:{name}:{i}"
    with fair.slot("repack", job_id=job_id, fairness_key=name, timeout=60, app=fairapp.app):
        rec.record("start", tag, type="repack")
        time.sleep(0.2)
        rec.record("end", tag, type="repack")
print("ok", flush=True)
"""

# A caller that enters a repack slot on linux, says so, and stays inside until killed.
STAYS = """
import threading
import fairapp
import celery_fair as fair

rec = fairapp.Recorder(fairapp.os.environ["FAIRAPP_PREFIX"])
with fair.slot("repack", job_id="linux", fairness_key="web", timeout=30, app=fairapp.app):
    rec.record("start", "slot:linux:stays", type="repack")
    threading.Event().wait()
"""


def callers(run, names_and_jobs):
    """The caller processes, each ready (its scheduler made) and waiting for ``go``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CALLER, name, ",".join(jobs)],
            cwd=HERE,
            env=run.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, jobs in names_and_jobs
    ]
    ready = f"{run.recorder.prefix}:ready"
    wait_until(
        lambda: (
            run.recorder.redis.llen(ready) == len(procs) or any(p.poll() is not None for p in procs)
        ),
        120,
        "the callers to be ready",
    )
    return procs


def go(run, names_and_jobs):
    for name, _ in names_and_jobs:
        run.recorder.release(f"go:{name}")


def test_slots_in_four_processes_share_the_type_cap_and_conflicts_with_worker_jobs(
    make_run, start_worker, broker
):
    # Given two workers of two processes each, and repacks capped at 2 fleet-wide, with a
    # conflict on their repository (the git group),
    run = make_run(conf=fleet_conf(broker))
    start_fleet(run, start_worker, n=2, concurrency=2)
    # when four web processes each run three repack slots (one of linux) once eight repack
    # jobs (three of linux) published to the workers have started (one of them for 2 s, so
    # that the slots surely run while a worker job holds a place of the cap),
    plan = [(f"web{p}", ["linux", f"p{p}a", f"p{p}b"]) for p in range(4)]
    procs = callers(run, plan)
    for i in range(8):
        job = "linux" if i % 3 == 0 else f"w{i}"
        seconds = 2.0 if i == 1 else 0.3
        run.send(
            "fairapp.repack", f"job:{job}:{i}", seconds, headers=fair_headers("repack", "bg", job)
        )
    wait_until(
        lambda: any(e["tag"] == "job:w1:1" for e in run.recorder.events()),
        30,
        "the long worker job to start",
    )
    go(run, plan)
    try:
        outputs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert out.strip() == "ok", err
    wait_until(lambda: len(run.recorder.done_counts()) == 8, 60, "the 8 worker jobs")
    # then every block and job ran, never more than two at once across the six processes,
    events = run.recorder.events()
    spans = intervals(events, "repack")
    slots = {t: s for t, s in spans.items() if t.startswith("slot:")}
    jobs = {t: s for t, s in spans.items() if t.startswith("job:")}
    assert len(slots) == 12
    assert len(jobs) == 8
    assert len({e["pid"] for e in events if e["tag"].startswith("slot:")}) == 4
    assert max_overlap(list(spans.values())) == 2
    # and never two on linux at once, a worker's job or a slot.
    linux = [s for t, s in spans.items() if t.split(":")[1] == "linux"]
    assert len(linux) == 7
    assert max_overlap(linux) == 1
    # Slots and worker jobs shared the cap: some ran side by side.
    assert any(s0 < j1 and j0 < s1 for s0, s1 in slots.values() for j0, j1 in jobs.values()), (
        "no slot ever ran beside a worker job"
    )


def test_a_process_killed_inside_a_slot_frees_its_conflict_when_its_lease_expires(
    make_run, start_worker, broker
):
    # Given a worker, a lease of 3 s, and a web process inside a slot on linux,
    lease = 3.0
    run = make_run(conf=fleet_conf(broker, fair_lease_seconds=lease))
    start_worker(run, concurrency=2)
    proc = subprocess.Popen(
        [sys.executable, "-c", STAYS],
        cwd=HERE,
        env=run.env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: run.recorder.events(), 30, "the slot to be entered")
        # when a worker job on linux arrives, it waits for the conflict,
        run.send("fairapp.repack", "job:linux", 0.01, headers=fair_headers("repack", "bg", "linux"))
        run.send("fairapp.repack", "job:other", 0.01, headers=fair_headers("repack", "bg", "gcc"))
        wait_until(lambda: run.recorder.done_counts().get("job:other"), 30, "the other job")
        assert "job:linux" not in run.recorder.done_counts()
        # and when the process is killed inside the slot,
        killed = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    # then the job starts once the lease has expired (its last beat was at most 1 s before),
    # not before the kill: the conflict held while the process lived.
    wait_until(lambda: run.recorder.done_counts().get("job:linux"), 30, "the linux job")
    start = next(e["t"] for e in run.recorder.events() if e["tag"] == "job:linux")
    assert lease - 1.5 <= start - killed <= lease + 3.0, start - killed


def test_a_waiting_slot_takes_the_next_freed_slot_before_a_workers_held_backlog(
    make_run, start_worker, broker
):
    # Given a worker running repacks (capped at 2) with a backlog of them held behind,
    run = make_run(conf=fleet_conf(broker))
    start_worker(run, concurrency=2)
    plan = [("web", ["mine"])]
    (proc,) = callers(run, plan)  # (ready before the backlog starts, however slow the host)
    for i in range(40):
        run.send("fairapp.repack", f"job:{i}", 0.4, headers=fair_headers("repack", "bg", f"r{i}"))
    wait_until(
        lambda: sum(e["event"] == "start" for e in run.recorder.events()) >= 2,
        30,
        "the backlog to run",
    )
    # when a web process asks for one repack slot while both repack slots are busy,
    at = time.time()
    go(run, plan)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "ok", err
    # then it claims the next one to free: at most two backlog jobs start in between (those
    # whose slots freed before the caller's first ask), not the rest of the backlog, which a
    # worker freeing a slot would otherwise admit again in the same store call.
    wait_until(lambda: len(run.recorder.done_counts()) == 40, 60, "the backlog")
    spans = intervals(run.recorder.events(), "repack")
    (entered,) = [s[0] for t, s in spans.items() if t.startswith("slot:")]
    passed = [t for t, s in spans.items() if t.startswith("job:") and at < s[0] < entered]
    after = [t for t, s in spans.items() if t.startswith("job:") and s[0] > entered]
    assert len(passed) <= 2, (passed, entered - at)
    assert len(after) >= 10, after  # the backlog was still there to pass it
