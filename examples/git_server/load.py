"""A git server's load, bursty and mixed, for a running fleet (docker-compose.yml runs it).

    python examples/git_server/load.py                  # until Ctrl-C, to GIT_SERVER_BROKER
    python examples/git_server/load.py --seconds 60

Every second three people clone a repository each; every ``--burst-every`` seconds an agent
publishes a burst of ``--burst`` clones at once; every few seconds background maintenance
(a repack, a pull, a snapshot) joins in. Watch it with Flower (the helper shows each job's
fairness key and wait) or ``celery -A examples.git_server.app fair top``: the people's clones
keep starting within a slot or two while the agent's burst drains.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # `examples.git_server`

from examples.git_server.app import REPO_SECONDS, pull, repack, snapshot, sync_clone

PEOPLE = ("alice", "bob", "carol", "dave", "erin")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0, help="stop after this long (0: never)")
    parser.add_argument("--burst", type=int, default=200, help="clones in an agent's burst")
    parser.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts")
    args = parser.parse_args()
    rng = random.Random()
    repos = list(REPO_SECONDS)
    start = time.monotonic()
    next_burst = start
    published = 0
    tick = 0
    while not args.seconds or time.monotonic() - start < args.seconds:
        if time.monotonic() >= next_burst:
            agent = f"agent-10.0.0.{rng.randrange(2, 250)}"
            for i in range(args.burst):
                repo = repos[i % len(repos)]
                sync_clone.apply_async([repo], fairness_key=agent, job_id=repo)
            published += args.burst
            next_burst += args.burst_every
        for person in rng.sample(PEOPLE, 3):
            repo = rng.choice(repos)
            sync_clone.apply_async([repo], fairness_key=person, job_id=repo)
            published += 1
        if tick % 5 == 0:
            repo = rng.choice(repos)
            for task in (repack, pull, snapshot):
                task.apply_async([repo], job_id=repo)
            published += 3
        tick += 1
        print(f"published {published}", flush=True)
        time.sleep(1.0)


if __name__ == "__main__":
    main()
