"""``-P fair`` as a Celery pool name, and the ``fair_*`` remote-control commands, registered
without loading the worker.

Celery has no entry point for pools and checks ``-P`` against a list taken when its CLI module
is imported, so the package (``celery_fair/__init__.py``) registers the ``fair`` alias and adds
it to that list: here, with nothing of the gate, the engine or the store imported. The pool
class itself (``worker/pool.py``) is loaded by Celery, by its path, when it resolves the alias
(this module names the path and imports nothing of the pool: the pool imports this module).

Every worker of an app that imports celery-fair knows the job-control commands
(``worker/control.py``), as before the gate was loaded lazily: one that is not fair still
revokes on ``fair_cancel`` and answers ``{}`` to ``fair_status``.
"""

from __future__ import annotations

import sys
from typing import Any

from celery import concurrency, signals

from . import control  # noqa: F401 - registers the fair_* remote-control commands

__all__ = ["ALIAS", "CLASS_PATH", "register"]

ALIAS = "fair"
CLASS_PATH = "celery_fair.worker.pool:FairPool"


def register() -> None:
    """Make ``-P fair`` and the class path valid ``--pool`` values. Idempotent."""
    concurrency.ALIASES[ALIAS] = CLASS_PATH
    worker_cli = sys.modules.get("celery.bin.worker")
    choices = getattr(getattr(worker_cli, "WORKERS_POOL", None), "choices", None)
    if choices is not None and ALIAS not in choices:
        worker_cli.WORKERS_POOL.choices = (*choices, ALIAS, CLASS_PATH)  # type: ignore[union-attr]
    signals.worker_init.connect(_on_worker_init, weak=False, dispatch_uid="celery_fair.pool")


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    """A worker that chose the fair pool (by alias, class path or class): let the pool check
    the settings and compose itself (``FairPool.on_worker_init``) before the worker builds
    anything. A pool still named by a string is loaded as Celery loads it just after this
    signal: by its path."""
    pool_cls = getattr(sender, "pool_cls", None)
    if isinstance(pool_cls, str):
        if pool_cls not in (ALIAS, CLASS_PATH):
            return
        pool_cls = concurrency.get_implementation(CLASS_PATH)
    configure = getattr(pool_cls, "on_worker_init", None)
    if configure is not None:
        configure(sender)
