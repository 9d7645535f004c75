"""Fairness headers: the only code that reads them from a message.

A message is a *fair job* when it names a job type (the ``job_type`` header) or its task is a
fair task (which declares one). Everything the parser finds wrong becomes a ``HeaderProblem``
with a documented outcome (docs/failure-modes.md); it never raises.

=================  ==========================  =========================================
header             absent                      malformed (wrong type, too long, unknown,
                                               not Unicode text)
=================  ==========================  =========================================
``job_type``       the task's declared type    the task's declared type; if it has none,
                   (else: not a fair job)      dead letter
``fairness_key``   the default key (``""``)    the default key
``job_id``         ``None``: no conflicts,     ``None`` if the type has no conflict group;
                   cost learned per type       otherwise dead letter (exclusion unsafe)
``fair_submitted`` the time the worker first   the time the worker first received it
                   received it
``fair_priority``  the type's priority         the type's priority
``id`` (Celery's)  (Celery's own problem)      not Unicode text: dead letter
=================  ==========================  =========================================

"Not Unicode text" is a ``str`` holding a lone surrogate (what ``json.loads('"\\ud800"')``
gives): it travels through both brokers but cannot be encoded as UTF-8, for the shard hash or
the store, so it never gets past this module.

With ``fair_on_bad_message = "reject"`` every problem sends the message to the dead letter
queue instead of being repaired.

Two headers are *bounded* rather than malformed (``FairHeaders.bounded``; never dead-lettered,
counted, and logged once per episode by the gate): a ``fair_submitted`` earlier than
``horizon`` seconds before the worker received the message becomes that, and one later than
the receipt becomes the receipt; a ``fair_priority`` that no job type and no ``fair_tier_caps``
entry declares becomes the type's priority. The bookkeeping headers the worker writes itself
(``fair_republished``, ``fair_paused_spill``) are read here too; a bad one counts as absent.
"""

from __future__ import annotations

import math
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from ..protocol import (
    ERROR,
    FAIRNESS_KEY,
    JOB_ID,
    JOB_TYPE,
    ON_DEMAND,
    PAUSED_SPILL,
    PRIORITY,
    REPUBLISHED,
    SUBMITTED,
    TOKEN,
    check_text,
    header_text,
    is_text,
    short,
)

# The header names and the text rules are the wire protocol's (protocol.py), shared with the
# producer side; they are named here too, as before, for the worker's modules.
__all__ = [
    "ERROR",
    "FAIRNESS_KEY",
    "JOB_ID",
    "JOB_TYPE",
    "ON_DEMAND",
    "PAUSED_SPILL",
    "PRIORITY",
    "REPUBLISHED",
    "SUBMITTED",
    "TOKEN",
    "FairHeaders",
    "HeaderProblem",
    "check_text",
    "header_text",
    "is_text",
    "job_uid",
    "parse_headers",
    "request_uid",
]


def job_uid(task_id: str, retries: object, replaced: object = 0) -> str:
    """A job's identity in the gate and the store: its task id, plus the retry it is, plus how
    many times it was replaced.

    Celery reuses a task id for another job twice over. ``Task.retry`` sends a new message with
    the same id (it may even arrive while the first run is still ending); ``Task.replace`` sends
    its replacement with the id of the task it replaces, and counts the replacements in the
    ``replaced_task_nesting`` header. Each gets its own uid, so neither is taken for a copy of
    the first run. Two messages with the same uid are copies of one job (a redelivery, or a
    message the broker duplicated): the gate and the store run one of them.

    >>> job_uid("1f0c", 0), job_uid("1f0c", 2), job_uid("1f0c", 2, 1)
    ('1f0c', '1f0c/retry-2', '1f0c/retry-2/replaced-1')
    """
    uid = task_id
    if retries and isinstance(retries, int):
        uid = f"{uid}/retry-{retries}"
    if replaced and isinstance(replaced, int):
        uid = f"{uid}/replaced-{replaced}"
    return uid


def request_uid(task_id: str, request: Mapping[str, Any]) -> str:
    """``job_uid`` of a request, from its task id and its request dict (Celery's headers)."""
    return job_uid(task_id, request.get("retries"), request.get("replaced_task_nesting"))


@dataclass(frozen=True, slots=True)
class HeaderProblem:
    """One thing wrong with a message's fairness headers."""

    header: str
    reason: str

    def __str__(self) -> str:
        return f"{self.header}: {self.reason}"


@dataclass(frozen=True, slots=True)
class FairHeaders:
    """What the gate needs to know about a fair job, after validation.

    Attributes:
        submitted: The producer's submission time (epoch seconds), or ``None`` if it gave none
            or an unusable one.
        problems: What was wrong and repaired (or, with ``rejected``, not repairable).
        rejected: The message must go to the dead letter queue instead of running.
        priority: The job's own priority (``fair_priority``), or ``None``: its type's.
        bounded: What was outside the worker's bounds and brought within them (an
            undeclared ``fair_priority``, a ``fair_submitted`` before the horizon); not
            among ``problems``: it never dead-letters the message.
        republished: How many times a worker returned the message to the broker
            (``fair_republished``; 0 when absent or not a non-negative int).
        paused_spill: The runtime policies' version it was returned under while paused
            (``fair_paused_spill``), or ``None``.
    """

    job_type: str
    job_id: str | None
    fairness_key: str
    submitted: float | None
    problems: tuple[HeaderProblem, ...] = ()
    rejected: bool = False
    priority: int | None = None
    bounded: tuple[HeaderProblem, ...] = ()
    republished: int = 0
    paused_spill: int | None = None


def parse_headers(
    headers: Mapping[str, Any] | None,
    *,
    declared_type: str | None,
    types: Mapping[str, str],
    default_key: str = "",
    max_length: int = 256,
    reject_all: bool = False,
    received: float | None = None,
    horizon: float = math.inf,
    priorities: Container[int] | None = None,
) -> FairHeaders | None:
    """Validate the fairness headers of one message.

    Args:
        headers: The message headers (Celery's request dict: its ``id`` is checked too).
        declared_type: The job type the task declares, or ``None`` for a plain task.
        types: Every known job type's name mapped to its conflict group (``""`` for none).
        default_key: The fairness key of a message that has none or a bad one.
        max_length: The longest fairness key or job id accepted, in characters.
        reject_all: Reject on any problem instead of repairing.
        received: When the worker received the message (epoch seconds): ``fair_submitted``
            is kept within ``[received - horizon, received]``; ``None``: taken as given.
        horizon: Seconds before ``received`` that ``fair_submitted`` may claim.
        priorities: The declared priorities a job's own ``fair_priority`` may take;
            ``None``: any positive int.

    Returns:
        ``None`` when the message is not a fair job (plain task, no ``job_type`` header),
        otherwise the validated headers.
    """
    headers = headers or {}
    problems: list[HeaderProblem] = []
    rejected = False

    job_type = declared_type
    if headers.get(JOB_TYPE) is not None:
        named = _text(headers[JOB_TYPE], max_length)
        if isinstance(named, HeaderProblem):
            problems.append(_named(named, JOB_TYPE))
        elif named not in types:
            problems.append(HeaderProblem(JOB_TYPE, f"unknown job type {named!r}"))
        else:
            job_type = named
        if job_type is None:  # a plain task naming a type we cannot honour
            return FairHeaders("", None, default_key, None, tuple(problems), rejected=True)
    if job_type is None:
        return None
    if job_type not in types:
        problems.append(HeaderProblem(JOB_TYPE, f"the task's type {job_type!r} is not declared"))
        rejected = True
    task_id = headers.get("id")
    if isinstance(task_id, str) and not is_text(task_id):  # the job's identity: no repair
        problems.append(HeaderProblem("id", f"not Unicode text: {short(task_id)}"))
        rejected = True

    key = default_key
    if headers.get(FAIRNESS_KEY) is not None:
        value = _text(headers[FAIRNESS_KEY], max_length)
        if isinstance(value, str):
            key = value
        else:
            problems.append(_named(value, FAIRNESS_KEY))

    job_id = None
    if headers.get(JOB_ID) is not None:
        value = _text(headers[JOB_ID], max_length)
        if isinstance(value, str):
            job_id = value
        else:
            problems.append(_named(value, JOB_ID))
            if types.get(job_type):  # exclusion cannot be honoured without the id
                rejected = True

    bounded: list[HeaderProblem] = []
    submitted = None
    if headers.get(SUBMITTED) is not None:
        stamp = headers[SUBMITTED]
        if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) and math.isfinite(stamp):
            submitted = float(stamp)
            if received is not None:
                # An ETA or countdown (a retry's too) reaches the gate when it is due: the time
                # before it is not a claim to check, only to bound.
                noted = bounded if headers.get("eta") is None else []
                submitted = _bound_submitted(submitted, received, horizon, noted)
        else:
            problems.append(HeaderProblem(SUBMITTED, f"not a finite number: {short(stamp)}"))

    priority = None
    if headers.get(PRIORITY) is not None:
        value = headers[PRIORITY]
        if not (type(value) is int and value >= 1):
            problems.append(HeaderProblem(PRIORITY, f"not a positive int: {short(value)}"))
        elif priorities is not None and value not in priorities:
            bounded.append(HeaderProblem(PRIORITY, f"{short(value)} is not a declared priority"))
        else:
            priority = value

    if reject_all and problems:
        rejected = True
    return FairHeaders(
        job_type,
        job_id,
        key,
        submitted,
        tuple(problems),
        rejected,
        priority,
        tuple(bounded),
        republished=_count(headers.get(REPUBLISHED)),
        paused_spill=_version(headers.get(PAUSED_SPILL)),
    )


def _bound_submitted(
    stamp: float, received: float, horizon: float, bounded: list[HeaderProblem]
) -> float:
    """``stamp`` within ``[received - horizon, received]``. A stamp after the receipt is a
    producer's clock running ahead (not counted); one before the horizon claims more waiting
    than the worker credits (counted in ``bounded``)."""
    if stamp > received:
        return received
    earliest = received - horizon
    if stamp < earliest:
        ago = received - stamp
        bounded.append(HeaderProblem(SUBMITTED, f"{ago:.0f} s before receipt, past the horizon"))
        return earliest
    return stamp


def _count(value: object) -> int:
    """A bookkeeping count: a non-negative int, else 0 (as if absent)."""
    return value if type(value) is int and value >= 0 else 0


def _version(value: object) -> int | None:
    """A policies' version: a non-negative int, else ``None`` (as if absent)."""
    return value if type(value) is int and value >= 0 else None


def _text(value: object, max_length: int) -> str | HeaderProblem:
    """A header as text, or the problem with it (``header`` filled in by the caller)."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return HeaderProblem("", f"bytes that are not UTF-8: {short(value)}")
    if not isinstance(value, str):
        return HeaderProblem("", f"not a string but {type(value).__name__}: {short(value)}")
    if len(value) > max_length:
        return HeaderProblem("", f"{len(value)} characters, more than {max_length}")
    if not is_text(value):
        return HeaderProblem("", f"not Unicode text (a lone surrogate): {short(value)}")
    return value


def _named(problem: HeaderProblem, header: str) -> HeaderProblem:
    return HeaderProblem(header, problem.reason)
