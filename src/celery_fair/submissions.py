"""Submitting once: the producer's side of idempotency keys (issue 22, seed 002).

``task.apply_async(args, fairness_key="alice", idempotency_key="order-17")`` publishes the job
once per ``(fairness key, idempotency key)`` within ``fair_idempotency_seconds`` (24 hours by
default): a duplicate publishes nothing and gets the first submission's result handle, the
same task id. The record is one Redis key in the shared store, set with ``SET NX`` before the
message is published, so it is atomic for every producer on every machine; a publish that
fails drops the record again (if it is still its own), so the caller's retry can publish.

It needs the shared store (``fair_store_url``, or a Redis broker): with none, or with the store
unreachable, ``apply_async`` raises before anything is published.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

__all__ = ["submit_once"]

# Each app's settings and the store its producers record submissions in, from its first
# keyed submit on.
_stores: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def submit_once(
    app: Any,
    fairness_key: str,
    idempotency_key: str,
    task_id: str,
    publish: Callable[[], Any],
    result: Callable[[str], Any],
) -> Any:
    """Call ``publish`` unless ``(fairness_key, idempotency_key)`` was submitted within the
    window; then return ``result(the first submission's task id)`` instead.

    Raises:
        ConfigurationError: The key is not a non-empty string, or there is no shared store.
        StoreUnavailable: The store cannot be reached (nothing was published).
    """
    settings, store = _store(app)
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise ConfigurationError(
            f"idempotency_key must be a non-empty string, got {idempotency_key!r}"
        )
    if len(idempotency_key) > settings.max_header_length:
        raise ConfigurationError(
            f"idempotency_key is longer than fair_max_header_length ({settings.max_header_length})"
        )
    held = store.claim_submission(
        fairness_key, idempotency_key, task_id, settings.idempotency_seconds
    )
    if held is not None:
        return result(held)
    try:
        return publish()
    except BaseException:
        store.forget_submission(fairness_key, idempotency_key, task_id)
        raise


def _store(app: Any) -> tuple[Any, Any]:
    """The app's settings and store, read and opened once per app."""
    known = _stores.get(app)
    if known is None:
        from .settings import FairSettings
        from .worker.bootstep import open_store

        settings = FairSettings.from_celery_conf(app.conf)
        store = open_store(settings, app)
        if store is None:
            raise ConfigurationError(
                "idempotency_key needs a shared store, for every producer to see the others' "
                "submissions: set fair_store_url to a Redis URL (or use a Redis broker)"
            )
        known = _stores[app] = (settings, store)
    return known
