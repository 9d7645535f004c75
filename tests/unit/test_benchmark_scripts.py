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


def test_sim_bench_burst_with_issue_34s_rules_runs_them_all():
    """--burst --rules: two-level keys, rates on keys, tenants and types, none binding."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        from sim_bench import make_burst
    finally:
        sys.path.remove(str(BENCHMARKS))
    from celery_fair.sim import parse_trace, simulate

    data = make_burst(400, 40, rules=True)
    trace = parse_trace(data)
    assert trace.config.key_separator == "/"
    assert all(job.fairness_key.startswith("t") and "/" in job.fairness_key for job in trace.jobs)
    assert all(t.rate is not None for t in trace.types)
    result = simulate(trace)
    assert all(outcome.finish is not None for outcome in result.jobs)  # no rate held one back
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "sim_bench.py"), "--burst", "--rules", "--jobs", "300",
         "--runs", "1"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "the whole command" in out
