"""Shared test configuration: hypothesis profiles."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# `dev` keeps the local loop quick; `ci` (set by .ci/run) digs deeper.
settings.register_profile("dev", max_examples=150, deadline=None)
settings.register_profile(
    "ci", max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# The private_redis fixture (tests/private_redis.py), for any tier.
pytest_plugins = ["private_redis"]
