"""The command line, in-process and as the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from celery_fair.cli import main

SCENARIO = Path(__file__).parents[1] / "scenarios" / "data" / "seed000_scenario4.json"


def test_simulate_prints_json_with_jobs_and_summary(capsys):
    assert main(["simulate", str(SCENARIO)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [j["start"] for j in out["jobs"]] == [0, 3, 0, 3]
    assert set(out["summary"]["keys"]) == {"", "dev1", "dev2"}


def test_simulate_table_format(capsys):
    assert main(["simulate", "--example", "git-hosting", "--format", "table"]) == 0
    assert "makespan:" in capsys.readouterr().out


def test_bad_input_exits_2_with_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"capacity": 1, "types": {}, "jobs": [{"name": "x"}]}')
    assert main(["simulate", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("celery-fair simulate: error: jobs[0].type")
    assert main(["simulate", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad.write_text("{not json")
    assert main(["simulate", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_python_dash_m_and_the_console_script_run_the_same_verb():
    module = subprocess.run(
        [sys.executable, "-m", "celery_fair", "simulate", str(SCENARIO)],
        capture_output=True,
        text=True,
        check=True,
    )
    script = shutil.which("celery-fair", path=str(Path(sys.executable).parent))
    assert script is not None
    console = subprocess.run(
        [script, "simulate", str(SCENARIO)], capture_output=True, text=True, check=True
    )
    assert json.loads(module.stdout) == json.loads(console.stdout)


def test_celery_fair_store_says_how_long_ago_a_dead_workers_lease_expired():
    # A worker that died stays in the store until a live worker's housekeeping reclaims it:
    # its lease is shown as expired some seconds ago, never as a negative time left.
    from celery_fair.cli import format_store

    state = {
        "schema": "3",
        "epoch": "1",
        "token": 7,
        "now": 1000.0,
        "recovering_until": None,
        "workers": [
            {"worker": "w1@a", "jobs": 1, "lease_until": 1029.84},
            {"worker": "w2@b", "jobs": 2, "lease_until": 349.7},
            {"worker": "w3@c", "jobs": 0, "lease_until": 999.96},
        ],
        "tiers": {},
        "types": {},
        "jobs": [],
        "conflicts": {},
        "costs": {},
        "keys": 0,
        "estimates": 0,
        "tombstones": 0,
    }
    lines = format_store(state, "here").splitlines()
    assert "  w1@a  1 running  lease 29.8 s left" in lines
    assert "  w2@b  2 running  lease expired 650.3 s ago (dead)" in lines
    assert "  w3@c  0 running  lease expired 0.0 s ago (dead)" in lines
    assert not any("-" in line for line in lines if "lease" in line)
