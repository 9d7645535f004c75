"""simulate --config and --plot: an alternative configuration beside the trace's own, and the
pictures' data (slots over time by key, waits by key), checked against the results."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from celery_fair.cli import main
from celery_fair.errors import TraceError
from celery_fair.plot import heavy_keys, slots_by_key, waits_by_key
from celery_fair.sim import load_bundled, parse_trace, simulate, with_overrides

ALT = Path(__file__).resolve().parents[2] / "examples" / "git_server" / "fewer-clones.toml"


def run(data):
    trace = parse_trace(data)
    return trace, simulate(trace)


def test_slots_by_key_never_exceed_capacity_and_add_up_to_the_slot_time():
    trace, result = run(load_bundled("git-hosting"))
    keys = heavy_keys(trace, result, top=2)
    assert keys == ["10.0.0.7", ""]  # by slot-time: the agent, then background work
    times, series = slots_by_key(trace, result, keys)
    totals = [sum(series[k][i] for k in series) for i in range(len(times))]
    assert max(totals) <= trace.capacity
    assert totals[-1] == 0  # everything ended
    # The area under each key's steps is its slot-time in the summary.
    for key in keys:
        area = sum(series[key][i] * (times[i + 1] - times[i]) for i in range(len(times) - 1))
        assert area == pytest.approx(result.summary["keys"][key]["slot_time"])


def test_waits_by_key_match_the_summarys_percentiles():
    trace, result = run(load_bundled("git-hosting"))
    waits = waits_by_key(trace, result, ["10.0.0.7"])["10.0.0.7"]
    assert waits == sorted(waits)
    assert waits[-1] == result.summary["keys"]["10.0.0.7"]["wait_max"]


def test_an_alternative_merges_type_options_and_keeps_the_jobs():
    data = load_bundled("git-hosting")
    alt = with_overrides(data, {"capacity": 4, "types": {"repack": {"max_concurrency": 1}}})
    assert alt["capacity"] == 4
    assert alt["types"]["repack"] == {**data["types"]["repack"], "max_concurrency": 1}
    assert alt["jobs"] == data["jobs"]
    assert data["capacity"] == 8  # the trace itself is untouched


@pytest.mark.parametrize(("overrides", "message"), [
    ({"jobs": []}, "unknown setting"),
    ({"types": {"nope": {"max_concurrency": 1}}}, "not a type of the trace"),
    ({"types": {"repack": 3}}, "expected a table of options"),
    ([1, 2], "expected a table"),
])  # fmt: skip
def test_a_bad_alternative_is_a_clear_error(overrides, message):
    with pytest.raises(TraceError, match=message):
        with_overrides(load_bundled("git-hosting"), overrides)


def test_simulate_runs_the_alternative_beside_and_draws_both(tmp_path, capsys):
    png, page = tmp_path / "out.png", tmp_path / "out.html"
    assert main(["simulate", "--example", "git-hosting", "--config", str(ALT),
                 "--plot", str(png)]) == 0  # fmt: skip
    runs = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in runs] == ["current", "alternative"]
    clones = [r["summary"]["keys"]["10.0.0.7"]["wait_p50"] for r in runs]
    assert clones[1] > clones[0]  # two clone slots instead of eight: the agent waits longer
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["simulate", "--example", "git-hosting", "--config", str(ALT),
                 "--plot", str(page), "--format", "table"]) == 0  # fmt: skip
    text = page.read_text()
    assert "<svg" in text
    assert "10.0.0.7" in text
    assert "== alternative" in capsys.readouterr().out


def test_a_plot_of_an_unknown_kind_is_refused(tmp_path, capsys):
    assert main(["simulate", "--example", "git-hosting", "--plot", str(tmp_path / "x.gif")]) == 2
    assert "expected a .png, .svg or .html file" in capsys.readouterr().err
