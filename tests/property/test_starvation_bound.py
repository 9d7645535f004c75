"""The starvation bound (docs/design.md, "The starvation bound"), checked on adversarial traces.

A foreground stream that never lets up keeps every slot busy and a backlog waiting; a
background job arrives in the middle of it. Without aging it would wait for the stream to end;
with aging it must start within ``grace + (urgent_threshold - base) * interval + k * L``: the
time to turn urgent, then at most one run time ``L`` per limit that can hold it (``k`` = the
global capacity, plus its type's cap and its tier's cap when they have one).
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from celery_fair.sim import parse_trace, simulate

quarter = st.integers(1, 16).map(lambda n: n / 4)


@st.composite
def adversarial(draw):
    capacity = draw(st.integers(1, 4))
    fg_priority = draw(st.sampled_from([4, 8]))
    base = draw(st.integers(1, fg_priority - 1))
    urgent = draw(st.integers(base + 1, fg_priority))
    interval = draw(st.sampled_from([0.5, 1, 2, 5]))
    grace = draw(st.sampled_from([0, 1, 5]))
    longest = draw(st.sampled_from([1, 2.5, 4]))  # every foreground job's run time is <= it
    aging = {"interval": interval, "grace": grace, "urgent": urgent}
    if draw(st.booleans()):
        aging["ceiling"] = urgent
    bg_cap = draw(st.sampled_from([None, 1, 2]))
    tier_cap = draw(st.sampled_from([None, 1, 3]))
    bg_type = {"priority": base, "default_cost": 5}
    if bg_cap is not None:
        bg_type["max_concurrency"] = bg_cap
    types = {
        # Foreground work never rises (it is born at its ceiling), so no older job turns
        # urgent ahead of the background one: the bound's one condition.
        "fg": {"priority": fg_priority, "aging": {"interval": 1, "ceiling": fg_priority}},
        "fg2": {"priority": fg_priority, "aging": {"interval": 1, "ceiling": fg_priority}},
        "bg": bg_type,
    }
    bound_limits = 1 + (bg_cap is not None) + (tier_cap is not None)
    arrival = draw(st.sampled_from([0, 0.25, 3, 10]))
    bound = grace + (urgent - base) * interval + bound_limits * longest
    horizon = arrival + bound + 4 * longest
    jobs = []
    # The stream: a burst, then a job every quarter second from keys that take turns (and a
    # heavy, weighted one), so some foreground job always waits for every slot that frees.
    t = 0.0
    n = 0
    keys = ["web", "api", "vip"]
    # At least ``capacity`` new jobs each quarter second: no more can end in that time.
    durations = draw(st.lists(quarter.filter(lambda d: d <= longest), min_size=1, max_size=4))
    extra = draw(st.integers(0, 2))
    while t < horizon:
        for _ in range(capacity + (n + extra) % 3 if n else 4 * capacity):
            jobs.append(
                {
                    "name": f"fg{n}",
                    "type": ("fg", "fg2")[n % 2],
                    "fairness_key": keys[n % 3],
                    "arrival": t,
                    "duration": durations[n % len(durations)],
                }
            )
            n += 1
        t += 0.25
    # Other background work of the same tier, already running or waiting, competes for the
    # background job's type and tier slots.
    for i in range(draw(st.integers(0, 3))):
        jobs.append(
            {
                "name": f"other{i}",
                "type": "bg",
                "fairness_key": "batch",
                "arrival": arrival + 0.25 * (i + 1),  # younger: never urgent ahead of it
                "duration": draw(quarter.filter(lambda d: d <= longest)),
            }
        )
    jobs.append(
        {
            "name": "background",
            "type": "bg",
            "fairness_key": "nightly",
            "arrival": arrival,
            "duration": 1,
        }
    )
    trace = {
        "capacity": capacity,
        "types": types,
        "tier_caps": {str(fg_priority): None, str(base): tier_cap},
        "keys": {
            "vip": {"weight": 5},
            "nightly": {"max_concurrency": draw(st.sampled_from([None, 0]))},
        },
        "aging": aging,
        "jobs": jobs,
    }
    return trace, bound, arrival


def start_of(trace, name):
    result = simulate(parse_trace(trace))
    return next(j for j in result.to_json()["jobs"] if j["name"] == name)


@given(adversarial())
def test_a_background_job_starts_within_the_bound_under_a_stream_that_never_lets_up(case):
    trace, bound, arrival = case
    job = start_of(trace, "background")
    assert job["start"] is not None
    assert job["start"] - arrival <= bound
    # Urgency is what got it in: it started at or above the threshold.
    assert job["effective_priority"] >= trace["aging"]["urgent"]


@given(adversarial())
def test_without_aging_the_same_stream_starves_it(case):
    # The premise of the bound test: the stream really is adversarial.
    trace = case[0]
    trace = {**trace, "aging": None}
    job = start_of(trace, "background")
    fg_end = max(j["arrival"] for j in trace["jobs"] if j["name"].startswith("fg"))
    assert job["start"] is None or job["start"] > fg_end
