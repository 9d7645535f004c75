"""The examples in public docstrings run and print what they say."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "celery_fair.core.clock",
    "celery_fair.core.reserve",
    "celery_fair.core.types",
    "celery_fair.core.scheduler",
    "celery_fair.store.base",
    "celery_fair.worker.consumer_prefetch",
    "celery_fair.worker.episodes",
    "celery_fair.worker.headers",
    "celery_fair.protocol",
    "celery_fair.worker.shard_turns",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name))
    assert result.failed == 0
    assert result.attempted > 0
