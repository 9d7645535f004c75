"""Job control from anywhere (issue 22): where a job is, and why it is not running yet.

``status(app, task_id)`` asks every fair worker at once (a Celery remote-control command,
``fair_status``, which each worker answers from its gate in O(1), plus O(held) for a held job's
place) and, if none holds or runs it, the result backend. The answer's ``state`` is one of:

- ``held``: a worker holds its message, waiting; with ``worker``, ``place`` (among the jobs that
  worker holds), ``place_in_key`` (among its fairness key's), ``effective_priority``,
  ``expected_wait`` (seconds until it is expected to start: ``Scheduler.expected_start``;
  ``None`` while it waits for a pause, a type cap or a tier cap, which ``waits_for`` names),
  ``expected_wait_defaults`` (the share of that estimate built on default costs) and
  ``why``,
  the reasons in words ("type cap repack 3/3", "conflict on git:linux held by task X",
  "paused (key 'spam')", "behind 4 jobs that come first ..."). The worker answers in values
  (``blockers``, ``ahead``, ``waits_for_reason``: ``core.inspect.why_to_dict``); they are
  written in English here (``celery_fair.words``), and a reply from an older worker, which
  has the words alone, is taken as it is;
- ``reserved``: admitted, waiting for a free process on ``worker``;
- ``running`` on ``worker``;
- ``done`` (``result_state`` says how: ``SUCCESS``, ``FAILURE``), ``cancelled`` (revoked), as
  the result backend says;
- ``queued``: no worker has it, and the producers' registry (``fair_track_submits``) says it
  was submitted and has not ended: it is in the broker; with its ``place_in_key`` and ``place``
  among the submissions not ended, by time of submission, ``key_rate`` (its key's submissions
  ended per second lately, 0 until known) and, once that is known, ``expected_wait``: its
  key's jobs ahead of it at that pace;
- ``unknown``: no worker has it and neither the backend nor the registry knows it. That is
  also the answer for a job still in the broker when the registry is off (the default): a
  worker holds about a window of a burst, the rest waits in the broker. ``tracking`` says
  whether the registry was asked (``False``: turn on ``fair_track_submits`` to see such a job
  as ``queued``).

``cancel(app, task_id)`` sends Celery's own ``revoke`` to every worker inside one remote-control
command, ``fair_cancel``, which then asks the worker's gate for the job (O(1)): a held or
reserved job is dropped at once and its key refunded. The answer's ``state`` is one of:

- ``cancelled``: a worker held it, and dropped it (``worker`` says which); or it was already
  cancelled;
- ``already_running``: a worker runs it; revoked, and with ``terminate=True`` its process is
  signalled (side effects it has made stay made: see docs/operations.md);
- ``already_done``: the result backend has its result;
- ``unknown``: no worker has it, and no registry says it was submitted. If it is still in the
  broker, every worker that answered drops it when it arrives (it is in their revoked set, as
  with ``celery revoke``): ``remembered_by`` lists them (empty: no worker answered, and a
  worker started later does not know it). ``tracking`` says whether the registry was asked;
  with ``fair_track_submits`` a job still in the broker is ``cancelled`` instead
  (``queued: True``).

``reprioritize(app, task_id, priority)`` gives a job that has not started its own priority
(``None``: its type's again), through one remote-control command, ``fair_reprioritize``, which
each worker answers from its gate in O(log held). The job is taken as arriving now: its aging
starts over, and it goes behind the jobs of its key already waiting at that priority. The
answer's ``state`` is one of:

- ``ok``: a worker held it, and it waits at its new priority now (``worker`` says which); or
  it is still in the broker (``queued: True``, with ``fair_track_submits``): every worker
  remembers the priority and the job takes it when it arrives;
- ``already_running``: a worker has admitted or runs it; nothing changed;
- ``already_done``: the result backend has its result (or says it was revoked);
- ``unknown``: no worker has it and no registry says it was submitted. Every fair worker that
  answered remembers the priority (the last 50,000 given) and gives it to the job if it
  arrives: ``remembered_by`` lists them. ``tracking`` as for ``cancel``.

The job is named by its Celery task id; its ``job_id`` is the resource it works on.

These are the clients (producer side); the remote-control commands that each worker answers
(``fair_status``, ``fair_cancel``, ``fair_reprioritize``) are the worker's, in
``worker/control.py``.
"""

from __future__ import annotations

import time
from typing import Any

from celery.backends.base import DisabledBackend

from . import words
from .connect import settings_of, tracked_store, untrack
from .core.inspect import why_from_dict
from .core.types import BlockReason, check_priority
from .errors import ConfigurationError, StoreUnavailable
from .protocol import LIST_STATES, ControlAnswer

__all__ = ["cancel", "jobs", "reprioritize", "status"]

#: What the result backend's state says of a job no worker has.
_BACKEND_STATES = {
    "SUCCESS": "done",
    "FAILURE": "done",
    "REVOKED": "cancelled",
    "STARTED": "running",
    "RETRY": "unknown",
}


def status(app: Any, task_id: str, timeout: float = 1.0) -> dict[str, Any]:
    """Where job ``task_id`` is, fleet-wide (see the module's docstring)."""
    replies = app.control.broadcast(
        "fair_status", arguments={"ids": [task_id]}, reply=True, timeout=timeout
    )
    for reply in replies or ():
        for worker, answer in reply.items():
            found = answer.get(task_id) if isinstance(answer, dict) else None
            if found:
                found = in_words({"task_id": task_id, "worker": worker, **found})
                return _name_the_holder(app, found)
    out: dict[str, Any] = {"task_id": task_id, "state": "unknown"}
    if not isinstance(app.backend, DisabledBackend):
        result_state = app.AsyncResult(task_id).state
        if result_state in _BACKEND_STATES:
            out["state"] = _BACKEND_STATES[result_state]
            out["result_state"] = result_state
            return out
    found = _tracked(app, task_id)
    if found is not None:  # submitted, not ended, at no worker: in the broker
        out.update(
            state="queued",
            fairness_key=found.fairness_key,
            submitted=found.at,
            place_in_key=found.place_in_key,
            in_key=found.in_key,
            place=found.place,
            total=found.total,
            key_rate=found.rate,
        )
        if found.expected_wait is not None:
            out["expected_wait"] = found.expected_wait
    else:
        out["tracking"] = _tracking(app)
    return out


#: What a worker's job-status reply says in values, and job control in words (``in_words``).
_VALUES = ("blockers", "ahead", "waits_for_reason")


def in_words(found: dict[str, Any]) -> dict[str, Any]:
    """A worker's answer to ``fair_status`` with what holds the job back written in English:
    ``why`` and ``waits_for`` from its values (``blockers``, ``ahead``, ``waits_for_reason``,
    which are dropped, so the answer reads as it always has). A reply without the values (a
    worker older than them) or with values this version cannot read (a newer worker's reason)
    keeps the words the worker wrote."""
    values = {name: found.pop(name) for name in _VALUES if name in found}
    if "blockers" not in values:
        return found
    try:
        why = why_from_dict(values)
        reason = values.get("waits_for_reason")
        waits_for = None if reason is None else BlockReason(reason)
    except ValueError:
        return found
    found["why"] = words.lines(why)
    found["waits_for"] = words.waits_for(waits_for, why)
    return found


def _name_the_holder(app: Any, found: dict[str, Any]) -> dict[str, Any]:
    """A held job waits for a conflict another worker's job holds: ask the shared store which
    job, on which worker, since when (one read), and say so in its reasons."""
    field = found.get("conflict")
    why = found.get("why") or []
    if not field or not any(words.ELSEWHERE in reason for reason in why):
        return found
    try:
        holder = tracked_store(app).holder(field)
    except (ConfigurationError, StoreUnavailable):
        return found
    if holder is None:
        return found
    worker = holder.worker.split("/")[0] or "another worker"
    since = f" for {holder.held_for:.1f} s" if holder.held_for is not None else ""
    named = f"held by task {holder.uid} on {worker}{since}"
    found["why"] = [reason.replace(words.ELSEWHERE, named) for reason in why]
    found["holder"] = holder._asdict()
    return found


def _answered(replies: Any, task_id: str) -> dict[str, list[str]]:
    """The workers that answered a job-control broadcast for ``task_id`` in words (``"ok"``,
    ``"cancelled"``, ``"already_running"``, ``"revoked"``, ``"remembered"``), sorted, by
    answer; an empty answer (an older worker that does not have the job), an error and a
    non-fair worker's reply are left out."""
    found: dict[str, list[str]] = {}
    for reply in replies or ():
        for worker, answer in reply.items():
            said = answer.get(task_id) if isinstance(answer, dict) else None
            if isinstance(said, str):
                found.setdefault(said, []).append(worker)
    return {said: sorted(workers) for said, workers in found.items()}


def _tracking(app: Any) -> bool:
    """Whether the producers' registry of submissions is on (``fair_track_submits``)."""
    return bool(settings_of(app).tracking)


def _tracked(app: Any, task_id: str) -> Any:
    """The tracked submission ``task_id`` (``fair_track_submits``), or ``None``."""
    if not _tracking(app):
        return None
    return tracked_store(app).queued(task_id)


#: At most this many jobs a worker lists when ``jobs`` needs every one it has, to tell them
#: from the queued ones (a worker holds at most ``fair_max_held``, 1,000 by default).
_EVERY = 100_000


def jobs(
    app: Any,
    *,
    key: str | None = None,
    state: str | None = None,
    type: str | None = None,
    limit: int = 100,
    timeout: float = 1.0,
) -> dict[str, Any]:
    """The fair jobs every fair worker runs, has reserved or holds, fleet-wide, and those
    still in the broker (seed 002's ``list(tenant, filters)``), filtered by fairness ``key``,
    ``state`` (``running``, ``reserved``, ``held`` or ``queued``) and job ``type``; ``None``:
    any. One remote-control command, ``fair_jobs``, which each worker answers from its gate
    in O(held + running); for queued jobs, one read of the producers' registry of submissions
    (``fair_track_submits``), which knows a job's key and not its type.

    Returns ``{"jobs": [...], "matched": n, "workers": w}``: the first ``limit`` jobs, running
    first, then reserved, held and queued, each longest first, each with its ``task_id``,
    ``state``, ``fairness_key`` and ``running`` or ``waited`` (seconds), and for a worker's
    ``worker``, ``type``, ``job_id`` and ``priority``; ``matched``: how many matched in all;
    ``workers``: how many fair workers answered. Queued jobs are listed when ``state`` is
    ``queued``, or ``None`` with the registry on and no ``type``; they are the registry's
    submissions not ended that no worker that answered has (their count: the registry's less
    what the workers have, which assumes every producer tracks its submissions).

    Raises:
        ConfigurationError: ``state`` is not one of those, ``limit`` is not an int >= 0, or
            queued jobs are asked for without the registry or by type.
    """
    if state is not None and state not in LIST_STATES:
        raise ConfigurationError(f"state must be one of {', '.join(LIST_STATES)}, got {state!r}")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ConfigurationError(f"limit must be an int >= 0, got {limit!r}")
    tracking = _tracking(app)
    if state == "queued" and not tracking:
        raise ConfigurationError(
            "queued jobs are listed from the producers' registry of submissions: set "
            "fair_track_submits = True (docs/configuration.md)"
        )
    if state == "queued" and type is not None:
        raise ConfigurationError(
            "queued jobs cannot be listed by type: the registry of submissions keeps a job's "
            "key, not its type"
        )
    queued = state == "queued" or (state is None and type is None and tracking)
    replies = app.control.broadcast(
        "fair_jobs",
        arguments={
            "key": key,
            "job_state": None if state == "queued" else state,
            "type": type,
            "limit": _EVERY if queued else limit,
        },
        reply=True,
        timeout=timeout,
    )
    found: list[dict[str, Any]] = []
    matched = workers = 0
    for reply in replies or ():
        for worker, answer in reply.items():
            if not isinstance(answer, dict) or "jobs" not in answer:
                continue  # not a fair worker (or an older release)
            workers += 1
            matched += int(answer.get("matched", 0))
            found += [{**job, "worker": worker} for job in answer["jobs"]]
    if queued:
        have = {job["task_id"] for job in found}
        if state == "queued":
            found, matched = [], 0
        page, tracked = tracked_store(app).tracked(key, limit + len(have))
        now = time.time()
        found += [
            {
                "task_id": t.task_id,
                "state": "queued",
                "fairness_key": t.fairness_key,
                "waited": round(max(0.0, now - t.at), 3),
            }
            for t in page
            if t.task_id not in have
        ][:limit]
        matched += max(0, tracked - len(have))
    found.sort(
        key=lambda job: (
            LIST_STATES.index(job["state"]),
            -float(job.get("running", job.get("waited", 0.0))),
        )
    )
    return {"jobs": found[:limit], "matched": matched, "workers": workers}


def cancel(
    app: Any,
    task_id: str,
    *,
    terminate: bool = False,
    signal: str | None = None,
    timeout: float = 1.0,
) -> dict[str, Any]:
    """Cancel job ``task_id`` fleet-wide (see the module's docstring)."""
    backend = None if isinstance(app.backend, DisabledBackend) else app.backend
    before = backend.get_state(task_id) if backend is not None else None
    replies = app.control.broadcast(
        "fair_cancel",
        arguments={"task_id": task_id, "terminate": terminate, "signal": signal},
        reply=True,
        timeout=timeout,
    )
    found = _answered(replies, task_id)
    out: dict[str, Any] = {"task_id": task_id}
    for answer in (ControlAnswer.CANCELLED, ControlAnswer.ALREADY_RUNNING):
        if answer.value in found:
            out.update(state=answer.value, worker=found[answer.value][0])
            if answer is ControlAnswer.ALREADY_RUNNING:
                out["terminated"] = terminate
            return out
    after = backend.get_state(task_id) if backend is not None else None
    if after in ("SUCCESS", "FAILURE"):
        out["state"] = "already_done"
        out["result_state"] = after
    elif before == "REVOKED":
        out["state"] = "cancelled"
    elif before == "STARTED":
        out["state"] = "already_running"
    elif _tracked(app, task_id) is not None:
        # submitted, not ended, at no worker: in the broker, and now in every worker's revoked
        # set, so dropped when it arrives (which forgets it, task_revoked)
        out["state"] = "cancelled"
        out["queued"] = True
        untrack(app, [task_id])  # its place counts against no limit from now on
    else:
        out.update(
            state="unknown",
            remembered_by=found.get(ControlAnswer.REVOKED.value, []),
            tracking=_tracking(app),
        )
    return out


def reprioritize(
    app: Any, task_id: str, priority: int | None, *, timeout: float = 1.0
) -> dict[str, Any]:
    """Give job ``task_id`` the priority ``priority`` fleet-wide (see the module's docstring).

    Raises:
        SchedulerError: ``priority`` is not ``None`` or a positive int (nothing is sent).
    """
    check_priority(priority)
    replies = app.control.broadcast(
        "fair_reprioritize",
        arguments={"task_id": task_id, "priority": priority},
        reply=True,
        timeout=timeout,
    )
    found = _answered(replies, task_id)
    out: dict[str, Any] = {"task_id": task_id, "priority": priority}
    for answer in (ControlAnswer.OK, ControlAnswer.ALREADY_RUNNING):
        if answer.value in found:
            out.update(state=answer.value, worker=found[answer.value][0])
            return out
    if not isinstance(app.backend, DisabledBackend):
        result_state = app.backend.get_state(task_id)
        if result_state in ("SUCCESS", "FAILURE", "REVOKED"):
            out.update(state="already_done", result_state=result_state)
            return out
        if result_state == "STARTED":
            out["state"] = "already_running"
            return out
    if _tracked(app, task_id) is not None:  # in the broker: every worker remembers it
        out.update(state="ok", queued=True)
    else:
        out.update(
            state="unknown",
            remembered_by=found.get(ControlAnswer.REMEMBERED.value, []),
            tracking=_tracking(app),
        )
    return out
