"""The fair_* settings: defaults, validation, and messages that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from celery_fair import ConfigurationError, FairSettings
from celery_fair.connect import _sentinel_url
from celery_fair.core import Aging
from celery_fair.settings import DEFAULTS


def test_defaults_are_valid_and_documented():
    s = FairSettings.from_mapping({})
    assert (s.pool, s.max_held, s.on_bad_message) == ("prefork", 1000, "repair")
    doc = (Path(__file__).parents[2] / "docs" / "configuration.md").read_text()
    missing = [name for name in DEFAULTS if name not in doc]
    assert missing == []


def test_job_types_from_settings():
    s = FairSettings.from_mapping(
        {"fair_types": {"clone": {"priority": 8, "conflict_group": "git"}}}
    )
    assert s.types["clone"].conflict_group == "git"


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"fair_max_held": 0}, "fair_max_held"),
        ({"fair_max_held": "lots"}, "fair_max_held"),
        ({"fair_lookahead": -1}, "fair_lookahead"),
        ({"fair_lookahead": 1.5}, "fair_lookahead"),
        ({"fair_capacity": -1}, "fair_capacity"),
        ({"fair_max_hold_seconds": 0}, "fair_max_hold_seconds"),
        ({"fair_submitted_horizon_seconds": 0}, "fair_submitted_horizon_seconds"),
        ({"fair_submitted_horizon_seconds": float("inf")}, "fair_submitted_horizon_seconds"),
        ({"fair_submitted_horizon_seconds": "1h"}, "fair_submitted_horizon_seconds"),
        ({"fair_alpha": 2}, "fair_alpha"),
        ({"fair_cost_ttl": -5}, "fair_cost_ttl"),
        ({"fair_on_bad_message": "ignore"}, "fair_on_bad_message"),
        ({"fair_dead_letter_queue": ""}, "fair_dead_letter_queue"),
        ({"fair_tier_caps": {4: -1}}, "fair_tier_caps"),
        ({"fair_types": {"clone": {"conflict_group": "git"}}}, "priority is required"),
        ({"fair_types": {"clone": {"priority": 0}}}, r"fair_types\['clone'\]"),
        ({"fair_types": {"clone": {"priority": 8, "colour": 1}}}, "unknown option"),
        ({"fair_typo": 1}, "fair_typo"),
        ({"fair_keys": [("a", 1)]}, "fair_keys: must be a mapping"),
        ({"fair_keys": {"a": {"weight": -1}}}, "fair_keys: key policy 'a': weight must be a"),
        ({"fair_keys": {"a": {"max_concurrency": 1.5}}}, "key policy 'a': max_concurrency"),
        ({"fair_keys": {"a": {"share": 2}}}, "fair_keys: key policy 'a': unknown option"),
        ({"fair_keys": {"a": {"rate": "10/x"}}}, "fair_keys: key policy 'a': rate must be like"),
        ({"fair_keys": {"a": {"rate": "0/s"}}}, "fair_keys: key policy 'a': rate must be above 0"),
        ({"fair_keys": {"a": {"rate": "1/s", "burst": 0.5}}}, "key policy 'a': burst must be"),
        ({"fair_keys": {"a": {"rate": "1/s", "per": "hour"}}}, "key policy 'a': per must be one"),
        ({"fair_aging": {"grace": 5}}, "fair_aging: aging: interval is required"),
        ({"fair_aging": {"interval": -1}}, "fair_aging: aging interval must be a positive"),
        ({"fair_aging": 60}, "fair_aging: aging must be a mapping"),
        (
            {"fair_types": {"t": {"priority": 1, "aging": {"interval": 1, "urgent": 0}}}},
            r"fair_types\['t'\].aging: aging urgent_threshold",
        ),
        ({"fair_inherit_aging": "yes"}, "fair_inherit_aging: must be True or False"),
        ({"fair_track_submits": 1}, "fair_track_submits: must be True or False"),
        ({"fair_max_queued": 0}, "fair_max_queued: must be an int >= 1"),
        ({"fair_max_queued_per_key": -3}, "fair_max_queued_per_key: must be an int >= 1"),
        ({"fair_max_queued_per_key": {"a": 1.5}}, r"fair_max_queued_per_key\['a'\]"),
        ({"fair_max_queued_per_key": {7: 10}}, "keys are fairness keys"),
        ({"fair_on_queue_full": "drop"}, "fair_on_queue_full: must be one of raise, return"),
        ({"fair_key_separator": "::"}, "fair_key_separator: key_separator must be None or one"),
        ({"fair_key_separator": "*"}, "fair_key_separator: key_separator must be None or one"),
    ],
)
def test_a_bad_value_is_an_error_that_names_the_setting(values, named):
    with pytest.raises(ConfigurationError, match=named):
        FairSettings.from_mapping(values)


def test_reads_a_celery_configuration():
    from celery import Celery

    app = Celery(set_as_current=False)
    app.conf.fair_max_held = 50
    app.conf.fair_pool = "threads"
    s = FairSettings.from_celery_conf(app.conf)
    assert (s.max_held, s.pool) == (50, "threads")


def test_a_misspelt_fair_setting_in_the_celery_configuration_is_an_error():
    from celery import Celery

    app = Celery(set_as_current=False)
    app.conf.fair_max_hled = 5
    with pytest.raises(ConfigurationError, match="fair_max_hled"):
        FairSettings.from_celery_conf(app.conf)


@pytest.mark.parametrize(
    ("sentinels", "options", "url"),
    [
        (["sentinel://a:1/2", "sentinel://b:2"], {"master_name": "m 1"},
         "sentinel://a:1/2;sentinel://b:2?master_name=m%201"),
        (["sentinel://a:1/2?ssl=0"], {"master_name": "m"}, "sentinel://a:1/2?ssl=0&master_name=m"),
        (["sentinel://a:1?master_name=x"], {"master_name": "m"}, "sentinel://a:1?master_name=x"),
        (["sentinel://a:1"], {}, "sentinel://a:1"),  # RedisStore.from_url says what is missing
    ],
)  # fmt: skip
def test_a_sentinel_broker_gives_the_store_its_sentinels_and_master_name(sentinels, options, url):
    assert _sentinel_url(sentinels, options) == url


def test_a_sentinel_store_url_is_accepted():
    url = "sentinel://a:26379;sentinel://b:26379/0?master_name=m"
    assert FairSettings.from_mapping({"fair_store_url": url}).store_url == url


def test_store_urls_are_shown_without_their_passwords():
    url = "sentinel://:pw1@a:1/0;sentinel://u:pw2@b:2?master_name=m&sentinel_password=pw3"
    shown = FairSettings.from_mapping({"fair_store_url": url}).describe()["store"]
    assert shown == "sentinel://:***@a:1/0;sentinel://u:***@b:2?master_name=m&sentinel_password=***"
    assert "pw" not in shown.replace("sentinel_password", "")


def test_policies_by_key_reach_the_core_and_the_startup_description():
    s = FairSettings.from_mapping(
        {"fair_keys": {"tenant:*": {"max_concurrency": 2}, "ci": {"weight": 0.5}, "*": {}}}
    )
    config = s.scheduler_config(4)
    assert config.keys.for_key("tenant:acme").max_concurrency == 2
    assert config.keys.for_key("ci").weight == 0.5
    assert s.describe()["keys"] == {"ci": {"weight": 0.5}, "tenant:*": {"max_concurrency": 2}}


def test_aging_reaches_the_core_per_type_and_for_the_rest():
    s = FairSettings.from_mapping(
        {
            "fair_aging": {"interval": 60, "grace": 300, "urgent_threshold": 8},
            "fair_types": {"rescan": {"priority": 1, "aging": {"interval": 10, "ceiling": 8}}},
        }
    )
    config = s.scheduler_config(4)
    assert config.aging == Aging(interval=60, grace=300, urgent_threshold=8)
    assert s.types["rescan"].aging == Aging(interval=10, max_effective_priority=8)
    described = s.describe()
    assert described["aging"] == {
        "interval": 60.0,
        "grace": 300.0,
        "max_effective_priority": None,
        "urgent_threshold": 8,
    }
    assert described["types"]["rescan"]["aging"]["max_effective_priority"] == 8


def test_queue_limits_per_key_fall_back_to_the_star_and_turn_tracking_on():
    assert not FairSettings.from_mapping({}).tracking
    assert FairSettings.from_mapping({"fair_track_submits": True}).tracking
    one = FairSettings.from_mapping({"fair_max_queued_per_key": 50})
    assert one.tracking
    assert (one.key_queue_limit("a"), one.key_queue_limit("b")) == (50, 50)
    some = FairSettings.from_mapping({"fair_max_queued_per_key": {"big": 500, "*": 5}})
    assert (some.key_queue_limit("big"), some.key_queue_limit("other")) == (500, 5)
    only = FairSettings.from_mapping({"fair_max_queued_per_key": {"big": 500}})
    assert only.key_queue_limit("other") is None
    assert FairSettings.from_mapping({"fair_max_queued": 10}).tracking
