"""Fairness headers: every documented outcome, and a fuzz of the parser."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fair.routing import shard_of
from celery_fair.worker.events import received_fields
from celery_fair.worker.headers import (
    FAIRNESS_KEY,
    JOB_ID,
    JOB_TYPE,
    PAUSED_SPILL,
    PRIORITY,
    REPUBLISHED,
    SUBMITTED,
    parse_headers,
)

TYPES = {"clone": "git", "snapshot": ""}
#: What a tenant name read from a JSON API can be: a str that no encoder takes as UTF-8.
LONE = json.loads('"\\ud800"')


def parse(headers, declared="clone", **kw):
    return parse_headers(headers, declared_type=declared, types=TYPES, max_length=16, **kw)


def test_a_plain_task_without_job_type_is_not_a_fair_job():
    assert parse({FAIRNESS_KEY: "a"}, declared=None) is None


def test_headers_of_a_good_message_pass_unchanged():
    h = parse({FAIRNESS_KEY: "alice", JOB_ID: "linux", SUBMITTED: 12.5})
    assert (h.job_type, h.fairness_key, h.job_id, h.submitted) == ("clone", "alice", "linux", 12.5)
    assert h.problems == ()
    assert not h.rejected


def test_missing_headers_take_the_documented_defaults():
    h = parse({}, default_key="anon")
    assert (h.fairness_key, h.job_id, h.submitted) == ("anon", None, None)
    assert h.problems == ()


def test_job_type_header_names_the_type_of_a_plain_task():
    h = parse({JOB_TYPE: "snapshot"}, declared=None)
    assert h.job_type == "snapshot"
    assert not h.rejected


def test_unknown_job_type_falls_back_to_the_declared_type():
    h = parse({JOB_TYPE: "nope"})
    assert h.job_type == "clone"
    assert not h.rejected
    assert "unknown job type" in str(h.problems[0])


def test_unknown_job_type_on_a_plain_task_is_rejected():
    h = parse({JOB_TYPE: "nope"}, declared=None)
    assert h.rejected


@pytest.mark.parametrize("bad", [7, ["a"], "x" * 17, b"\xff\xfe", {"a": 1}])
def test_bad_fairness_key_is_replaced_by_the_default_key(bad):
    h = parse({FAIRNESS_KEY: bad}, default_key="")
    assert h.fairness_key == ""
    assert not h.rejected
    assert h.problems[0].header == FAIRNESS_KEY


def test_utf8_bytes_are_taken_as_text():
    assert parse({FAIRNESS_KEY: "ünï".encode()}).fairness_key == "ünï"


def test_bad_job_id_is_rejected_when_the_type_has_a_conflict_group():
    assert parse({JOB_ID: 42}).rejected


def test_bad_job_id_is_dropped_when_the_type_has_no_conflict_group():
    h = parse({JOB_ID: 42}, declared="snapshot")
    assert h.job_id is None
    assert not h.rejected


@pytest.mark.parametrize("bad", ["soon", float("nan"), True, float("inf")])
def test_bad_submission_time_is_ignored(bad):
    h = parse({SUBMITTED: bad})
    assert h.submitted is None
    assert h.problems[0].header == SUBMITTED


def test_a_jobs_own_priority_is_read_and_a_bad_one_falls_back_to_the_types():
    assert parse({}).priority is None
    assert parse({PRIORITY: 9}).priority == 9
    for bad in (0, -3, 2.5, True, "9", None):
        h = parse({PRIORITY: bad})
        assert h.priority is None
        assert not h.rejected
        if bad is not None:  # an absent header is no problem
            assert [p.header for p in h.problems] == [PRIORITY]


def test_reject_policy_rejects_any_problem():
    assert parse({FAIRNESS_KEY: 7}, reject_all=True).rejected


def test_a_header_that_is_not_unicode_text_is_repaired_or_dead_lettered_like_any_bad_one():
    # A lone surrogate travels through both brokers as a str, but the shard hash and the
    # store cannot encode it: it must never get past the parser.
    h = parse({FAIRNESS_KEY: f"tenant-{LONE}"}, default_key="")
    assert (h.fairness_key, h.rejected) == ("", False)
    assert [p.header for p in h.problems] == [FAIRNESS_KEY]
    assert "not Unicode text" in str(h.problems[0])
    assert parse({JOB_ID: LONE}).rejected  # clone has a conflict group: exclusion unsafe
    free = parse({JOB_ID: LONE}, declared="snapshot")
    assert (free.job_id, free.rejected) == (None, False)
    assert parse({JOB_TYPE: LONE}, declared=None).rejected
    assert parse({"id": f"task-{LONE}", FAIRNESS_KEY: "k"}).rejected  # its identity in the store
    pair = json.loads('"\\ud83d\\ude00"')  # a surrogate pair in JSON is one character: fine
    assert parse({FAIRNESS_KEY: pair}).fairness_key == pair == "\U0001f600"


def test_fair_submitted_is_kept_between_the_horizon_and_the_receipt():
    def submitted(stamp, **kw):
        return parse({SUBMITTED: stamp}, received=1000.0, horizon=60.0, **kw)

    forged = submitted(1.0)
    assert forged.submitted == 940.0  # counts as 60 s of waiting, not 999
    assert [p.header for p in forged.bounded] == [SUBMITTED]
    assert forged.problems == ()
    assert not submitted(1.0, reject_all=True).rejected  # a bound, not a malformed header
    ahead = submitted(1500.0)  # a producer's clock ahead of the worker's
    assert (ahead.submitted, ahead.bounded) == (1000.0, ())
    retry = submitted(950.0)  # a retry's or a returned message's own clock, within it
    assert (retry.submitted, retry.bounded) == (950.0, ())
    assert parse({SUBMITTED: 1.0}).submitted == 1.0  # no receipt given: taken as it is
    # a job with a countdown reaches the gate when it is due: bounded, but not counted
    later = parse({SUBMITTED: 1.0, "eta": "1970-01-01T00:16:40"}, received=1000.0, horizon=60.0)
    assert (later.submitted, later.bounded) == (940.0, ())


def test_an_undeclared_priority_runs_at_the_types_priority_and_is_counted_not_dead_lettered():
    declared = frozenset({8, 4, 9})
    assert parse({PRIORITY: 9}, priorities=declared).priority == 9
    for reject_all in (False, True):
        h = parse({PRIORITY: 10**9}, priorities=declared, reject_all=reject_all)
        assert (h.priority, h.rejected, h.problems) == (None, False, ())
        assert [p.header for p in h.bounded] == [PRIORITY]


def test_a_bad_bookkeeping_header_counts_as_absent():
    assert (parse({}).republished, parse({}).paused_spill) == (0, None)
    assert parse({REPUBLISHED: 3, PAUSED_SPILL: 5}).republished == 3
    assert parse({REPUBLISHED: 3, PAUSED_SPILL: 5}).paused_spill == 5
    for bad in ("x", -1, 2.5, True, [1], None):
        h = parse({REPUBLISHED: bad, PAUSED_SPILL: bad})
        assert (h.republished, h.paused_spill, h.problems, h.rejected) == (0, None, (), False)


surrogates = st.integers(0xD800, 0xDFFF).map(chr)
# Text as producers send it, lone surrogates included (st.text() alone never makes them).
texts = st.text(st.characters() | surrogates, max_size=20)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=5,
)
NAMES = [FAIRNESS_KEY, JOB_ID, JOB_TYPE, SUBMITTED, PRIORITY, REPUBLISHED, PAUSED_SPILL, "id"]
header_maps = st.dictionaries(st.sampled_from([*NAMES, "other"]), values | texts)
DECLARED = frozenset({2, 8})


@given(header_maps, st.sampled_from(["clone", "snapshot", None]), st.booleans())
def test_fuzz_parser_never_raises_and_returns_only_safe_values(headers, declared, reject_all):
    h = parse(
        headers,
        declared=declared,
        reject_all=reject_all,
        received=1000.0,
        horizon=60.0,
        priorities=DECLARED,
    )
    if h is None:
        assert declared is None
        return
    if h.rejected:
        assert h.problems
        return
    assert h.job_type in TYPES
    assert isinstance(h.fairness_key, str)
    assert len(h.fairness_key) <= 16
    assert h.job_id is None or (isinstance(h.job_id, str) and len(h.job_id) <= 16)
    for text in (h.fairness_key, h.job_id or "", headers.get("id") or ""):
        if isinstance(text, str):
            text.encode("utf-8")  # what the store and the logs do with them
    shard_of(h.fairness_key, 8)
    assert h.submitted is None or 940.0 <= h.submitted <= 1000.0
    assert h.priority is None or h.priority in DECLARED
    assert type(h.republished) is int
    assert h.republished >= 0
    assert h.paused_spill is None or type(h.paused_spill) is int
    assert not (reject_all and h.problems)


def test_task_received_events_leave_out_a_header_that_is_not_unicode_text():
    # The strategy reads the raw headers before the gate (with -E): it must not meet the
    # shard hash with a lone surrogate either.
    message = SimpleNamespace(headers={FAIRNESS_KEY: LONE, JOB_ID: "linux", JOB_TYPE: "clone"})
    assert received_fields(message, shards=8) == {JOB_ID: "linux", JOB_TYPE: "clone"}
    message.headers[FAIRNESS_KEY] = "k"
    assert received_fields(message, shards=8)["shard"] == shard_of("k", 8)
