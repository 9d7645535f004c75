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
