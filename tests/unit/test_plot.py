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


FIRST_EXAMPLE = {  # simulator.md's first trace: each key has one job
    "capacity": 8,
    "types": {
        "sync-clone": {"priority": 8, "max_concurrency": 8, "conflict_group": "git",
                       "default_cost": 10},
        "repack": {"priority": 4, "max_concurrency": 3, "conflict_group": "git",
                   "default_cost": 20},
    },
    "jobs": [
        {"name": "repack:linux", "type": "repack", "job_id": "linux", "fairness_key": "",
         "arrival": 0, "duration": 12},
        {"name": "alice:1", "type": "sync-clone", "job_id": "linux", "fairness_key": "10.0.0.7",
         "arrival": 1, "duration": 30, "cost": 30},
    ],
}  # fmt: skip


def wait_lines(fig):
    """The wait chart's lines by label: each line's points."""
    ax = fig.axes[-1]
    return {line.get_label(): list(zip(line.get_xdata(), line.get_ydata(), strict=True))
            for line in ax.get_lines()}  # fmt: skip


def drawn(points):
    """A line has length: it is not one point (or one point repeated)."""
    return len(set(points)) > 1


@pytest.mark.parametrize(
    "runs",
    [
        pytest.param(lambda: [("trace", *run(FIRST_EXAMPLE))], id="one-job-per-key"),
        pytest.param(
            lambda: [
                ("current", *run(load_bundled("git-hosting"))),
                (
                    "alternative",
                    *run(with_overrides(load_bundled("git-hosting"), _toml(ALT))),
                ),
            ],
            id="git-hosting-comparison",
        ),
    ],
)
def test_every_key_has_a_visible_wait_line_and_no_legend_covers_a_chart(runs):
    import matplotlib.pyplot as plt

    from celery_fair.plot import figure

    runs = runs()
    fig = figure(runs)
    try:
        lines = wait_lines(fig)
        _, trace, result = runs[0]
        for label, _, _ in runs:
            for key in heavy_keys(trace, result):
                name = f"{key or '(background)'} ({label})"
                # each key's ECDF is drawn, a key of one job or of equal waits too
                assert name in lines, sorted(lines)
                assert drawn(lines[name]), (name, lines[name])
                assert lines[name][-1][1] == 1.0  # it reaches every job
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            legend = ax.get_legend()
            assert legend is not None
            box, chart = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
            assert not box.overlaps(chart), (ax.get_title(), box, chart)  # beside, not over
            assert box.x1 <= fig.bbox.x1 + 1  # and inside the picture
    finally:
        plt.close(fig)


def _toml(path):
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)
