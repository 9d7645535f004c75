"""The git-server example runs against a real broker and shows what fairness buys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness import BROKERS

EXAMPLE = Path(__file__).parents[2] / "examples" / "git_server" / "run.py"


def test_git_server_example_gives_the_late_clients_a_shorter_wait_than_plain_celery(broker):
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--broker", BROKERS[broker]],
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = done.stdout
    assert done.returncode == 0, f"exit {done.returncode}\n{out}\n{done.stderr}"
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.startswith(("alice", "bob"))
    }
    for client in ("alice", "bob"):
        _, _, plain_p50, _, fair_p50, _ = rows[client]
        assert float(fair_p50.rstrip("s")) < float(plain_p50.rstrip("s")) / 3, out
