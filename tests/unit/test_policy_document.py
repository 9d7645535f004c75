"""The runtime policies' document: what it holds, how it lies on top of fair_keys, and what a
document it cannot read does."""

from __future__ import annotations

import pytest

from celery_fair.core import KeyPolicies
from celery_fair.errors import ConfigurationError
from celery_fair.policies import RuntimePolicies


def test_a_document_round_trips_and_an_empty_one_is_no_policy():
    p = (
        RuntimePolicies()
        .with_key("tenant:acme", weight=3)
        .with_key("tenant:*", max_concurrency=4)
        .paused("key", "spam", True)
        .paused("type", "rescan", True)
        .paused("tenant", "acme", True)
    )
    assert RuntimePolicies.from_json(p.to_json()) == p
    assert RuntimePolicies.from_json("") == RuntimePolicies()
    assert p.paused("tenant", "acme", False).paused_tenants == frozenset()
    assert p.paused_keys == frozenset({"spam"})  # each kind apart


def test_a_worker_follows_the_documents_paused_tenants():
    from helpers import make

    from celery_fair.runtime_policies import apply_to

    s, _ = make(2, [("job", 1, None, "", 1.0)], key_separator="/")
    apply_to(s, KeyPolicies(), RuntimePolicies().paused("tenant", "acme", True))
    assert s.paused_tenants == frozenset({"acme"})
    s.submit("a", "job", None, "acme/x")
    s.submit("b", "job", None, "beta/x")
    assert [a.uid for a in s.schedule()] == ["b"]
    s.complete("b", 1.0)
    apply_to(s, KeyPolicies(), RuntimePolicies())
    assert s.paused_tenants == frozenset()
    assert [a.uid for a in s.schedule()] == ["a"]


def test_runtime_entries_replace_configured_ones_of_the_same_name_and_reset_restores_them():
    configured = KeyPolicies.from_mapping({"acme": {"weight": 2}, "ci-*": {"max_concurrency": 1}})
    p = RuntimePolicies().with_key("acme", weight=5).with_key("new", min_slots=1)
    merged = p.merged(configured)
    assert merged.for_key("acme").weight == 5
    assert merged.for_key("ci-7").max_concurrency == 1  # untouched
    assert merged.for_key("new").min_slots == 1
    assert p.without_key("acme").merged(configured).for_key("acme").weight == 2


def test_options_accumulate_and_none_removes_one():
    p = RuntimePolicies().with_key("k", weight=3, max_concurrency=2)
    p = p.with_key("k", max_concurrency=None, min_slots=1)
    assert dict(p.keys["k"]) == {"weight": 3, "min_slots": 1}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("not json", "not JSON"),
        ("[1]", "expected a JSON object"),
        ('{"keys": {"a": {"weight": -1}}}', "weight must be a positive"),
        ('{"keys": {"a": {"share": 1}}}', "unknown option"),
        ('{"paused_keys": "a"}', "must be a list of names"),
    ],
)
def test_a_document_it_cannot_read_is_an_error_that_says_why(doc, message):
    with pytest.raises(ConfigurationError, match=message):
        RuntimePolicies.from_json(doc)


def test_bad_options_are_refused_before_anything_is_written():
    with pytest.raises(ConfigurationError, match="weight"):
        RuntimePolicies().with_key("k", weight=0)
    with pytest.raises(ConfigurationError, match="unknown option"):
        RuntimePolicies().with_key("k", colour="red")
    with pytest.raises(ConfigurationError, match="'key', a 'type' or a 'tenant'"):
        RuntimePolicies().paused("queue", "q", True)


def test_runtime_policies_without_a_shared_store_are_a_clear_error():
    from celery import Celery

    from celery_fair.policies import FleetPolicies

    app = Celery("t", broker="memory://", set_as_current=False)
    with pytest.raises(ConfigurationError, match="runtime policies need a shared store"):
        FleetPolicies(app)
    app.close()
