"""The five scenarios of the seed's appendix: every start and finish, exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_fair.sim import parse_trace, simulate

DATA = Path(__file__).parent / "data"
SCENARIOS = sorted(p.name.removesuffix(".json") for p in DATA.glob("seed000_scenario?.json"))


def load(name: str) -> tuple[dict, dict]:
    trace = json.loads((DATA / f"{name}.json").read_text())
    expected = json.loads((DATA / f"{name}.expected.json").read_text())
    return trace, expected


def test_all_five_scenarios_are_present():
    assert len(SCENARIOS) == 5


@pytest.mark.parametrize("name", SCENARIOS)
def test_simulator_reproduces_the_seed_exactly(name):
    trace, expected = load(name)
    assert simulate(parse_trace(trace)).to_json()["jobs"] == expected["jobs"]


def test_scenario1_foreground_starts_the_moment_it_arrives():
    trace, _ = load("seed000_scenario1")
    jobs = simulate(parse_trace(trace)).to_json()["jobs"]
    clone = next(j for j in jobs if j["name"] == "sync-clone:r99")
    assert clone["start"] == 3


def test_scenario2_client_b_is_not_stuck_behind_client_a():
    trace, _ = load("seed000_scenario2")
    jobs = {j["name"]: j for j in simulate(parse_trace(trace)).to_json()["jobs"]}
    b_start = max(jobs["sync-clone:b1"]["start"], jobs["sync-clone:b2"]["start"])
    a_last = max(jobs[f"sync-clone:a{i}"]["start"] for i in range(1, 11))
    assert b_start < a_last
