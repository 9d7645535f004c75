"""Run the git-server workload through plain Celery, then through ``-P fair``; compare waits.

    python examples/git_server/run.py                     # in-memory broker, in-process worker
    python examples/git_server/run.py --broker redis://127.0.0.1:6379/0
    python examples/git_server/run.py --broker amqp://guest:guest@127.0.0.1:5672//
    python examples/git_server/run.py --concurrency 8        # the worker's slots (default 4)

With no ``--broker`` nothing needs to be running: Kombu's in-memory transport and a worker
inside this process (thread pool). With ``--broker`` the worker is a real ``celery worker``
subprocess (prefork), started and stopped by its PID; its log goes to a temporary file, removed
when the run succeeds and named on stderr when it fails.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from celery_fair.routing import DEFAULT_SHARDS, shard_name

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))  # make `examples.git_server` importable

CONCURRENCY = 4
SHARDS = DEFAULT_SHARDS


@dataclass
class Sent:
    client: str
    what: str
    published: float
    result: object


def workload(app: object, tasks: dict) -> list[Sent]:
    """Background maintenance, then an agent's burst of clones, then two people's clones."""
    sent: list[Sent] = []

    def send(client: str, task: str, repo: str) -> None:
        options = {"job_id": repo}
        if client != "background":
            options["fairness_key"] = client
        result = tasks[task].apply_async([repo], **options)
        sent.append(Sent(client, f"{task}:{repo}", time.time(), result))

    for repo in ("linux", "git", "rails", "django"):
        send("background", "repack", repo)
        send("background", "pull", repo)
    for repo in ("curl", "react"):
        send("background", "snapshot", repo)
    repos = ["linux", "git", "rails", "django", "react", "curl"]
    for i in range(40):
        send("agent 10.0.0.7", "sync_clone", repos[i % len(repos)])
    time.sleep(0.3)
    for client, repo in (("alice", "react"), ("alice", "curl"), ("bob", "git"), ("bob", "curl")):
        send(client, "sync_clone", repo)
    return sent


def waits(sent: list[Sent]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for s in sent:
        info = s.result.get(timeout=120)  # type: ignore[attr-defined]
        out.setdefault(s.client, []).append(info["started"] - s.published)
    return out


def run_embedded(fair: bool, concurrency: int) -> dict[str, list[float]]:
    from celery.contrib.testing.worker import start_worker
    from examples.git_server.app import app, pull, repack, snapshot, sync_clone

    from celery_fair.worker.pool import FairPool

    app.conf.fair_pool = "threads"
    app.conf.fair_shards = SHARDS if fair else 1  # plain Celery workers consume no shards
    tasks = {"sync_clone": sync_clone, "repack": repack, "pull": pull, "snapshot": snapshot}
    pool = FairPool if fair else "threads"
    with start_worker(
        app,
        pool=pool,
        concurrency=concurrency,
        perform_ping_check=False,
        loglevel="WARNING",
        shutdown_timeout=30,
    ):
        return waits(workload(app, tasks))


def run_subprocess(fair: bool, broker: str, concurrency: int) -> dict[str, list[float]]:
    queue = f"git-server-{uuid.uuid4().hex[:6]}"
    backend = broker if broker.startswith("redis") else "rpc://"
    env = {
        **os.environ,
        "GIT_SERVER_BROKER": broker,
        "GIT_SERVER_BACKEND": backend,
        "GIT_SERVER_QUEUE": queue,
        "PYTHONPATH": str(HERE.parent.parent),
    }
    os.environ.update(
        {k: env[k] for k in ("GIT_SERVER_BROKER", "GIT_SERVER_BACKEND", "GIT_SERVER_QUEUE")}
    )
    import importlib

    import examples.git_server.app as module

    importlib.reload(module)
    module.app.conf.fair_shards = SHARDS if fair else 1  # plain Celery workers consume no shards
    tasks = {
        "sync_clone": module.sync_clone,
        "repack": module.repack,
        "pull": module.pull,
        "snapshot": module.snapshot,
    }
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below
        prefix=f"worker-{queue}-", suffix=".log", delete=False
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "examples.git_server.app",
            "worker",
            "-P",
            "fair" if fair else "prefork",
            "-c",
            str(concurrency),
            "-Q",
            queue,
            "--without-mingle",
            "--without-gossip",
            "-l",
            "WARNING",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    ok = False
    try:
        deadline = time.time() + 60
        while not module.app.control.ping(timeout=0.5):
            if proc.poll() is not None or time.time() > deadline:
                raise SystemExit(f"the worker did not start; see {log.name}")
        result = waits(workload(module.app, tasks))
        ok = True
        return result
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
        if ok:
            Path(log.name).unlink(missing_ok=True)
        else:  # say what the worker said: the log stays for a closer look
            tail = Path(log.name).read_text(errors="replace")[-4000:]
            print(f"worker log {log.name} (its end):\n{tail}", file=sys.stderr)
        with module.app.connection_for_write() as conn:  # leave the broker as we found it
            for name in (queue, *(shard_name(queue, i) for i in range(SHARDS))):
                conn.default_channel.queue_delete(name)
        module.app.close()


def report(plain: dict[str, list[float]], fair: dict[str, list[float]]) -> str:
    rows = [("client", "jobs", "plain p50", "plain max", "fair p50", "fair max")]
    for client in sorted(plain, key=lambda c: (c == "background", c)):
        p, f = plain[client], fair[client]
        rows.append(
            (
                client,
                str(len(p)),
                *(
                    f"{v:.2f}s"
                    for v in (statistics.median(p), max(p), statistics.median(f), max(f))
                ),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", help="a Redis or RabbitMQ URL (default: in-memory)")
    parser.add_argument(
        "-c",
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"the worker's slots, as celery worker -c (default: {CONCURRENCY})",
    )
    args = parser.parse_args()
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    where = args.broker or "memory:// (in-process worker)"
    print(f"git-server workload, {args.concurrency} slots, broker {where}")
    results = {}
    for mode in ("plain", "fair"):
        print(f"  running through {'-P fair' if mode == 'fair' else 'plain Celery'} ...")
        fair = mode == "fair"
        if args.broker:
            results[mode] = run_subprocess(fair, args.broker, args.concurrency)
        else:
            results[mode] = run_embedded(fair, args.concurrency)
    print("\nwait from publish to start, per client:\n")
    print(report(results["plain"], results["fair"]))


if __name__ == "__main__":
    main()
