"""The benchmark scripts keep running (their numbers are recorded by hand, never asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).parents[2] / "benchmarks"


def test_core_bench_quick_run_prints_every_case_and_the_memory_line():
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "core_bench.py"), "--quick", "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = [line.split()[0] for line in out.splitlines()[2:5]]
    assert rows == ["quick", "quick", "quick"]
    assert "memory per pending job" in out


def test_gate_bench_quick_run_measures_the_gate_in_both_states():
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gate_bench.py"), "--quick"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert set(rows) == {"memory", "redis"}
    assert all(float(row[3]) > 0 for row in rows.values())  # CPU per task
    assert float(rows["memory"][7]) == 0  # alone, no store calls
    assert float(rows["redis"][7]) > 0


def test_sim_bench_times_every_phase():
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "sim_bench.py"), "--jobs", "500", "--runs", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for phase in ("read JSON", "check the trace", "simulate (core + summary)", "write JSON"):
        assert phase in out
    assert "jobs per second" in out
