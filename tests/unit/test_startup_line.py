"""The one line a fair worker says at startup, and where it says it (the worker's log level)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from celery_fair.worker import bootstep
from celery_fair.worker.bootstep import announce, startup_line


def test_the_line_names_the_pool_inside_its_slots_and_reserve_apart_the_store_and_shards():
    line = startup_line(
        worker="w1@host",
        pool="prefork",
        slots=2,
        reserve=(1, 1),
        store="redis://:secret@10.0.0.5:6379/0",
        prefix="fair",
        shards=8,
        queues=["git", "celery"],
    )
    assert line == (
        "celery-fair: -P fair on w1@host: prefork pool inside, 2 slots and a reserve of 1; "
        "store redis://:**@10.0.0.5:6379/0 (prefix fair); 8 shards per queue (git, celery)"
    )
    alone = startup_line(
        worker="w1@host", pool="threads", slots=4, reserve=(0, 0), store=None, prefix="fair",
        shards=1, queues=["celery"],
    )  # fmt: skip
    assert alone.endswith(
        "threads pool inside, 4 slots and no reserve; no shared store (this worker decides "
        "alone); no shards"
    )
    sentinel = startup_line(
        worker="w", pool="prefork", slots=1, reserve=(1, 8),
        store="sentinel://:pw@a:26379;sentinel://:pw@b:26379/0", prefix="p", shards=1, queues=[],
    )  # fmt: skip
    assert "pw" not in sentinel
    assert "a reserve of 1 to 8 (adaptive)" in sentinel


def test_at_the_default_log_level_the_line_is_printed_under_the_banner(monkeypatch, caplog):
    printed = []
    monkeypatch.setattr(bootstep, "print", lambda *a, **k: printed.append(a), raising=False)
    with caplog.at_level(logging.INFO, logger=bootstep.logger.name):
        # celery worker's default -l WARNING: printed, as the banner is;
        announce(SimpleNamespace(loglevel=logging.WARNING, quiet=False), "the line")
        assert printed == [("the line",)]
        assert not caplog.records
        # --quiet hides the banner, and the line with it;
        announce(SimpleNamespace(loglevel=logging.WARNING, quiet=True), "the line")
        assert len(printed) == 1
        # -l INFO: logged, once, and not printed.
        announce(SimpleNamespace(loglevel=logging.INFO, quiet=False), "the line")
    assert len(printed) == 1
    assert [r.getMessage() for r in caplog.records] == ["the line"]
