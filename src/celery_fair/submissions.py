"""Submitting once, and tracking what was submitted (issue 22, seed 002).

``task.apply_async(args, fairness_key="alice", idempotency_key="order-17")`` publishes the job
once per ``(fairness key, idempotency key)`` within ``fair_idempotency_seconds`` (24 hours by
default): a duplicate publishes nothing and gets the first submission's result handle, the
same task id. The record lives in the shared store, so it holds for every producer on every
machine, and it never names a message that was not published (issue 31): a submit first
claims a *pending* record (atomically: one producer wins), publishes, then confirms it as
published; a publish that fails, or a limit that refuses it, drops the pending record, so the
caller's retry (or a duplicate) publishes. A duplicate that finds the record pending waits for
the outcome, at most ``fair_idempotency_wait_seconds``: published, it returns that task's
handle; dropped, it claims the record and publishes itself; still pending, it raises
``SubmissionPending`` (never a handle to a task that may not exist). A pending record whose
producer died lapses after ``fair_idempotency_pending_seconds``.

With ``fair_track_submits`` (or a ``fair_max_queued*`` limit) every fair submit is recorded in
the shared store before it is published (``Store.track``, one round trip) and forgotten when it
ends: the worker's ``task_postrun`` (any state but ``RETRY``: a retry is the same submission)
and ``task_revoked`` signals, the gate's dead letter, and a copy the worker drops because the
job already ran to the end. Job control then sees a job still in the broker (``queued``, its
place within its key and overall), and a limit refuses a submit with ``QueueFull`` before
anything is published, atomically for every producer. A publish that fails withdraws its
entry (not counted as an end).

Both need the shared store (``fair_store_url``, or a Redis broker): with none, or with the store
unreachable, ``apply_async`` raises before anything is published.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery.signals import task_postrun, task_revoked
from celery.utils.log import get_logger

from .connect import app_store as _store
from .connect import settings_of, tracked_store, untrack
from .errors import ConfigurationError, QueueFull, StoreUnavailable, SubmissionPending

# settings_of, tracked_store and untrack live in connect.py (the worker's end of a job needs
# untrack too); they are named here as before.
__all__ = ["settings_of", "submit_once", "submit_tracked", "tracked_store", "untrack"]

logger = get_logger(__name__)


def submit_once(
    app: Any,
    fairness_key: str,
    idempotency_key: str,
    task_id: str,
    publish: Callable[[], Any],
    result: Callable[[str], Any],
) -> Any:
    """Call ``publish`` unless ``(fairness_key, idempotency_key)`` was submitted within the
    window; then return ``result(the first submission's task id)`` instead, once that one is
    published (waiting for it at most ``fair_idempotency_wait_seconds``). A ``QueueFull``
    that ``publish`` returns is returned, and records nothing.

    Raises:
        ConfigurationError: The key is not a non-empty string, or there is no shared store.
        StoreUnavailable: The store cannot be reached (nothing was published).
        SubmissionPending: The first submit's outcome is still not known (nothing published).
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
    wait = settings.idempotency_wait_seconds
    deadline = time.monotonic() + wait
    pause = 0.005
    while True:
        held = store.claim_submission(
            fairness_key, idempotency_key, task_id, settings.idempotency_pending_seconds
        )
        if held is None:
            break  # ours to publish
        if held.published:
            return result(held.task_id)
        # Another producer is publishing it: wait for it to confirm, or to give up (then the
        # next claim is ours).
        left = deadline - time.monotonic()
        if left <= 0:
            raise SubmissionPending(fairness_key, idempotency_key, wait)
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.1)
    try:
        outcome = publish()
    except BaseException:
        _forget_claim(store, fairness_key, idempotency_key, task_id)
        raise
    if isinstance(outcome, QueueFull):  # refused, returned (fair_on_queue_full = "return")
        _forget_claim(store, fairness_key, idempotency_key, task_id)
        return outcome
    try:
        confirmed = store.confirm_submission(
            fairness_key, idempotency_key, task_id, settings.idempotency_seconds
        )
    except StoreUnavailable as exc:
        logger.warning(
            "celery-fair: task %s was published, but the record of idempotency key %r could not "
            "be confirmed (%s): duplicates get SubmissionPending until it lapses after "
            "fair_idempotency_pending_seconds, then publish again",
            task_id,
            idempotency_key,
            exc,
        )
    else:
        if not confirmed:
            logger.warning(
                "celery-fair: task %s was published after its pending record of idempotency "
                "key %r lapsed (fair_idempotency_pending_seconds): a duplicate may have been "
                "published meanwhile",
                task_id,
                idempotency_key,
            )
    return outcome


def _forget_claim(store: Any, fairness_key: str, idempotency_key: str, task_id: str) -> None:
    """Drop a pending record whose submit published nothing; a store that cannot be reached
    leaves it to lapse (duplicates meanwhile get ``SubmissionPending``, never its id)."""
    try:
        store.forget_submission(fairness_key, idempotency_key, task_id)
    except StoreUnavailable as exc:
        logger.warning(
            "celery-fair: could not drop the pending record of idempotency key %r (%s); it "
            "lapses after fair_idempotency_pending_seconds",
            idempotency_key,
            exc,
        )


def submit_tracked(
    app: Any,
    fairness_key: str,
    task_id: str,
    publish: Callable[[], Any],
    retry_after: Callable[[Any], float],
) -> Any:
    """Record ``task_id`` as submitted by ``fairness_key``, then call ``publish``; past a
    limit, publish nothing and raise (or return, ``fair_on_queue_full = "return"``)
    ``QueueFull`` with ``retry_after(store)`` as its hint. A publish that fails is forgotten.

    Raises:
        QueueFull: A limit refused the submit.
        StoreUnavailable: The store cannot be reached (nothing was published).
    """
    settings, store = _store(app)
    counted = store.track(
        fairness_key,
        task_id,
        key_limit=settings.key_queue_limit(fairness_key),
        total_limit=settings.max_queued,
        seconds=settings.track_seconds,
    )
    if counted.refused_by:
        if counted.refused_by == "key":
            count, limit = counted.in_key, settings.key_queue_limit(fairness_key)
        else:
            count, limit = counted.total, settings.max_queued
        full = QueueFull(fairness_key, counted.refused_by, count, limit, retry_after(store))
        if settings.on_queue_full == "return":
            return full
        raise full
    try:
        return publish()
    except BaseException:
        if counted.added:
            try:
                store.untrack([task_id], ended=False)  # it never was: not an end
            except StoreUnavailable as exc:
                logger.warning(
                    "celery-fair: could not withdraw the tracked entry of unpublished task %s "
                    "(%s); it lapses after fair_track_seconds",
                    task_id,
                    exc,
                )
        raise


def _is_fair(task: Any) -> bool:
    return getattr(type(task), "job_type_name", None) is not None


def _tracking(app: Any) -> bool:
    try:
        return bool(settings_of(app).tracking)
    except ConfigurationError:  # the worker has said so at startup
        return False


def _ended(
    sender: Any = None, task_id: str | None = None, state: str | None = None, **_: Any
) -> None:
    """A fair task's run ended (in the process that ran it): its submission ended, unless the
    run asked for a retry, which is the same submission."""
    if task_id and state != "RETRY" and _is_fair(sender) and _tracking(sender.app):
        untrack(sender.app, [task_id])


def _revoked(sender: Any = None, request: Any = None, **_: Any) -> None:
    """A fair task was revoked or expired (before it ran, or terminated)."""
    task_id = getattr(request, "id", None)
    if task_id and _is_fair(sender) and _tracking(sender.app):
        untrack(sender.app, [task_id])


task_postrun.connect(_ended, weak=False, dispatch_uid="celery_fair.submissions.ended")
task_revoked.connect(_revoked, weak=False, dispatch_uid="celery_fair.submissions.revoked")
