"""Errors raised by celery-fair, split by who is at fault.

::

    FairError
     ├── ConfigurationError      the operator's settings or job types are wrong (raise at startup)
     │    └── TraceError         a simulator trace is malformed
     ├── MessageError            a producer sent a job the worker cannot take as it is
     ├── SchedulerError          the scheduling core was used against its contract (a bug)
     │    ├── DuplicateJob       a job reference was submitted twice
     │    ├── UnknownJob         a job reference the core does not hold
     │    └── UnknownJobType     a job names a type that was never registered
     ├── StoreUnavailable        the shared store cannot be reached (infrastructure)
     ├── RunTimeout              run_sync's job did not finish in time (it was cancelled)
     ├── SlotTimeout             fair.slot was not admitted in time (it was withdrawn)
     ├── QueueFull               a submit past fair_max_queued(_per_key): nothing published
     └── SubmissionPending       a duplicate idempotent submit whose first one's outcome is
                                 not known yet: nothing published, no task id

Expected outcomes of normal operation (a job blocked, a cancel that came too late) are
return values, never exceptions.
"""

from __future__ import annotations

__all__ = [
    "ConfigurationError",
    "DuplicateJob",
    "FairError",
    "MessageError",
    "QueueFull",
    "RunTimeout",
    "SchedulerError",
    "SlotTimeout",
    "StoreUnavailable",
    "SubmissionPending",
    "TraceError",
    "UnknownJob",
    "UnknownJobType",
]


class FairError(Exception):
    """Root of every error celery-fair raises on purpose."""


class ConfigurationError(FairError, ValueError):
    """Raised at startup when a setting or a job type declaration is invalid."""


class TraceError(ConfigurationError):
    """Raised by the simulator when a trace does not follow the documented format."""


class MessageError(FairError, ValueError):
    """Raised when a message's fairness headers cannot be taken as they are."""


class SchedulerError(FairError, RuntimeError):
    """Raised when the scheduling core is called against its contract."""


class DuplicateJob(SchedulerError):
    """Raised when a job reference is submitted while the core still holds it."""


class UnknownJob(SchedulerError, KeyError):
    """Raised when an operation names a job reference the core does not hold."""


class StoreUnavailable(FairError, ConnectionError):
    """Raised when the shared-state store cannot be reached."""


class UnknownJobType(SchedulerError, KeyError):
    """Raised when a job names a job type that was never registered."""


class RunTimeout(FairError, TimeoutError):
    """Raised by ``run_sync`` when its job did not finish within the timeout.

    The job is then cancelled: ``cancel`` holds what the cancel found (``"cancelled"``: it never
    ran; ``"already_running"``: it was running and was revoked; ...).
    """

    def __init__(self, task_id: str, timeout: float, cancel: str) -> None:
        super().__init__(
            f"job {task_id} did not finish within {timeout:g} s; cancel answered {cancel!r}"
        )
        self.task_id = task_id
        self.timeout = timeout
        self.cancel = cancel


class SlotTimeout(FairError, TimeoutError):
    """Raised by ``fair.slot`` when the scheduler did not admit it within ``timeout`` seconds.

    It was withdrawn: nothing ran, its key was not charged. ``reasons`` says what held it back
    at that moment, as ``fair job`` would (a conflict, a cap, the jobs before it).
    """

    def __init__(
        self, type: str, job_id: str | None, timeout: float, reasons: list[str] | None = None
    ) -> None:
        what = type if job_id is None else f"{type} on {job_id}"
        why = f" ({'; '.join(reasons)})" if reasons else ""
        super().__init__(f"slot {what} was not admitted within {timeout:g} s{why}")
        self.type = type
        self.job_id = job_id
        self.timeout = timeout
        self.reasons = list(reasons or [])


class QueueFull(FairError):
    """A submit refused before anything was published: the fairness key (``scope="key"``) or
    the whole fleet (``scope="total"``) has ``limit`` jobs submitted and not ended.

    ``retry_after`` is a hint in seconds: about one job's time of this type, as the fleet has
    learned it, the time in which a running job of the key usually ends and frees a place.
    """

    def __init__(
        self, fairness_key: str, scope: str, count: int, limit: int, retry_after: float
    ) -> None:
        where = f"fairness key {fairness_key!r}" if scope == "key" else "the fleet"
        super().__init__(
            f"{where} has {count} jobs submitted and not ended (limit {limit}); "
            f"retry in about {retry_after:.3g} s"
        )
        self.fairness_key = fairness_key
        self.scope = scope
        self.count = count
        self.limit = limit
        self.retry_after = retry_after


class SubmissionPending(FairError, TimeoutError):
    """A duplicate idempotent submit: the first submit of ``(fairness_key, idempotency_key)``
    had neither published nor given up within ``waited`` seconds
    (``fair_idempotency_wait_seconds``). This call published nothing and has no task id to
    give; submit again later for the first one's id (or, if it failed, to publish)."""

    def __init__(self, fairness_key: str, idempotency_key: str, waited: float) -> None:
        super().__init__(
            f"the first submit of idempotency key {idempotency_key!r} (fairness key "
            f"{fairness_key!r}) has not published yet after {waited:g} s; its outcome is not "
            "known: nothing was published, submit again later"
        )
        self.fairness_key = fairness_key
        self.idempotency_key = idempotency_key
        self.waited = waited
