"""Fairness headers: every documented outcome, and a fuzz of the parser."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fair.worker.headers import (
    FAIRNESS_KEY,
    JOB_ID,
    JOB_TYPE,
    PRIORITY,
    SUBMITTED,
    parse_headers,
)

TYPES = {"clone": "git", "snapshot": ""}


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


values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=5,
)
header_maps = st.dictionaries(
    st.sampled_from([FAIRNESS_KEY, JOB_ID, JOB_TYPE, SUBMITTED, "other"]), values | st.text()
)


@given(header_maps, st.sampled_from(["clone", "snapshot", None]), st.booleans())
def test_fuzz_parser_never_raises_and_returns_only_safe_values(headers, declared, reject_all):
    h = parse(headers, declared=declared, reject_all=reject_all)
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
    assert h.submitted is None or isinstance(h.submitted, float)
    assert not (reject_all and h.problems)
