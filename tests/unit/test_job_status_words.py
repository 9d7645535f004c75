"""A worker's job-status reply says what holds a job back in values (``blockers``, ``ahead``,
``waits_for_reason``); job control writes them in English (``control.in_words``), the same
lines the worker used to write itself, and takes a reply from an older worker (words only) as
it is."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from test_gate import World

from celery_fair.control import in_words
from celery_fair.core import BlockReason
from celery_fair.core.inspect import (
    CapFull,
    ConflictHeld,
    Paused,
    SlotsBusy,
    Why,
    why_from_dict,
    why_to_dict,
)

BEHIND = "behind {} first (higher priority, or keys that have used less)"

#: One of each blocker, with the words the worker wrote for it before the values travelled.
WORDS = [
    (Paused(type="clone"), "paused (type clone)"),
    (Paused(key="spam"), "paused (key 'spam')"),
    (ConflictHeld("git", "linux", "t1", 2.25), "conflict on git:linux held by task t1 for 2.2 s"),
    (ConflictHeld("git", "rails"), "conflict on git:rails held by a job on another worker"),
    (CapFull(BlockReason.KEY_CAP, "tenant", 1, 2, 1), "key cap 'tenant' 3/1 (2 on other workers)"),
    (CapFull(BlockReason.TYPE_CAP, "repack", 3, 0, 3), "type cap repack 3/3"),
    (CapFull(BlockReason.TIER_CAP, 5, 1, 0, 1), "tier cap 5 1/1"),
    (SlotsBusy(4, 4), "every slot busy 4/4"),
]


def over_the_wire(reply: dict[str, Any]) -> dict[str, Any]:
    """``reply`` as a remote-control reply arrives: through JSON."""
    return json.loads(json.dumps(reply))


def test_the_values_travel_as_plain_data_and_come_back_the_same():
    blockers = tuple(blocker for blocker, _ in WORDS)
    for why in (Why(blockers, 4), Why((), 0), Why(blockers[:1], 1)):
        assert why_from_dict(over_the_wire(why_to_dict(why))) == why
    # something else is refused, not guessed at
    for wrong in (
        {},
        {"blockers": [], "ahead": "2"},
        {"blockers": [{"reason": "rate_limit"}], "ahead": 0},  # a reason from a newer worker
        {"blockers": [{"reason": "capacity", "running": 1}], "ahead": 0},  # a field missing
        {"blockers": ["capacity"], "ahead": 0},
    ):
        with pytest.raises(ValueError, match=r"^not a "):
            why_from_dict(wrong)


@pytest.mark.parametrize(("blocker", "said"), WORDS)
def test_each_blocker_in_a_reply_reads_as_the_words_the_worker_wrote(blocker, said):
    reply = over_the_wire(
        {"state": "held", **why_to_dict(Why((blocker,), 2)), "waits_for_reason": None}
    )
    assert in_words(reply) == {
        "state": "held",
        "why": [said, BEHIND.format("2 jobs that come")],
        "waits_for": "",
    }


def test_a_gates_reply_in_values_reads_exactly_as_the_words_it_sends_beside_them():
    # Given a gate of two slots that runs a build of repo-1 and a deploy (its cap: 1),
    w = World(slots=2)
    w.deliver("t1", key="a", job_id="repo-1")
    w.deliver("d1", job_type="deploy", key="b")
    # and holds a build of repo-1, a second deploy and an urgent job,
    w.deliver("t2", key="c", job_id="repo-1")
    w.deliver("d2", job_type="deploy", key="d")
    w.deliver("u1", job_type="urgent", key="e")
    w.clock.advance(2.0)
    expected = {
        "t2": (
            [
                "conflict on repo:repo-1 held by task t1 for 2.0 s",
                "every slot busy 2/2",
                BEHIND.format("1 job that comes"),
            ],
            "",
        ),
        "d2": (
            ["type cap deploy 1/1", "every slot busy 2/2", BEHIND.format("2 jobs that come")],
            "type cap deploy 1/1",
        ),
        "u1": (["every slot busy 2/2"], ""),
    }
    for task_id, (why, waits_for) in expected.items():
        # when job control reads its reply with the words the gate wrote left out,
        reply = over_the_wire(w.gate.job_status(task_id))
        assert (reply["why"], reply["waits_for"]) == (why, waits_for)  # the words, as before
        values_only = {k: v for k, v in reply.items() if k not in ("why", "waits_for")}
        shown = in_words(values_only)
        # then it writes the same words, and shows the rest of the reply as it was.
        assert (shown["why"], shown["waits_for"]) == (why, waits_for), task_id
        assert shown == {
            k: v for k, v in reply.items() if k not in ("blockers", "ahead", "waits_for_reason")
        }


def test_a_reply_from_an_older_worker_keeps_its_words():
    old = {
        "state": "held",
        "place": 3,
        "why": ["type cap repack 3/3", BEHIND.format("2 jobs that come")],
        "waits_for": "type cap repack 3/3",
        "conflict": "",
    }
    assert in_words(copy.deepcopy(old)) == old
    assert in_words({"state": "running"}) == {"state": "running"}


def test_values_this_version_cannot_read_leave_the_workers_words():
    """A newer worker's reason: its words stand, its values are not shown."""
    newer = {
        "state": "held",
        "blockers": [{"reason": "rate_limit", "key": "acme", "per_second": 2}],
        "ahead": 0,
        "waits_for_reason": "rate_limit",
        "why": ["rate limit acme 2/s"],
        "waits_for": "rate limit acme 2/s",
    }
    assert in_words(newer) == {
        "state": "held",
        "why": ["rate limit acme 2/s"],
        "waits_for": "rate limit acme 2/s",
    }


def test_a_job_nothing_holds_back_is_first_in_line_and_an_unnamed_wait_is_its_reason():
    reply = over_the_wire({**why_to_dict(Why((), 0)), "waits_for_reason": None})
    assert in_words(reply) == {"why": ["first in line: it starts at the next decision"],
                               "waits_for": ""}  # fmt: skip
    # a wait with no blocker of its reason among the values is named by the reason, as before
    reply = {**why_to_dict(Why((SlotsBusy(1, 1),), 0)), "waits_for_reason": "paused"}
    assert in_words(reply) == {"why": ["every slot busy 1/1"], "waits_for": "paused"}
