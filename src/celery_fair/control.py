"""Job control from anywhere (issue 22): where a job is, and why it is not running yet.

``status(app, task_id)`` asks every fair worker at once (a Celery remote-control command,
``fair_status``, which each worker answers from its gate in O(1), plus O(held) for a held job's
place) and, if none holds or runs it, the result backend. The answer's ``state`` is one of:

- ``held``: a worker holds its message, waiting; with ``worker``, ``place`` (among the jobs that
  worker holds), ``place_in_key`` (among its fairness key's), ``effective_priority`` and ``why``,
  the reasons in words ("type cap repack 3/3", "conflict on git:linux held by task X",
  "paused (key 'spam')", "behind 4 jobs that come first ...");
- ``reserved``: admitted, waiting for a free process on ``worker``;
- ``running`` on ``worker``;
- ``done`` (``result_state`` says how: ``SUCCESS``, ``FAILURE``), ``cancelled`` (revoked), as
  the result backend says;
- ``unknown``: no worker has it and the backend knows nothing: still in the broker, or never
  submitted (telling these apart needs the producers' registry of submissions, not built yet).

The job is named by its Celery task id; its ``job_id`` is the resource it works on.
"""

from __future__ import annotations

from typing import Any

from celery.backends.base import DisabledBackend
from celery.utils.functional import maybe_list
from celery.worker.control import inspect_command

__all__ = ["status"]

#: What the result backend's state says of a job no worker has.
_BACKEND_STATES = {
    "SUCCESS": "done",
    "FAILURE": "done",
    "REVOKED": "cancelled",
    "STARTED": "running",
    "RETRY": "unknown",
}


@inspect_command(variadic="ids", signature="[id1 [id2 [... [idN]]]]")  # type: ignore[untyped-decorator]
def fair_status(state: Any, ids: Any, **kwargs: Any) -> dict[str, Any]:
    """The fair jobs of ``ids`` that this worker holds, has reserved or runs (worker side)."""
    gate = getattr(state.consumer, "fair_gate", None)
    if gate is None:
        return {}
    out = {}
    for uid in maybe_list(ids) or ():
        found = gate.job_status(str(uid))
        if found is not None:
            out[str(uid)] = found
    return out


def status(app: Any, task_id: str, timeout: float = 1.0) -> dict[str, Any]:
    """Where job ``task_id`` is, fleet-wide (see the module's docstring)."""
    replies = app.control.broadcast(
        "fair_status", arguments={"ids": [task_id]}, reply=True, timeout=timeout
    )
    for reply in replies or ():
        for worker, answer in reply.items():
            found = answer.get(task_id) if isinstance(answer, dict) else None
            if found:
                return {"task_id": task_id, "worker": worker, **found}
    out: dict[str, Any] = {"task_id": task_id, "state": "unknown"}
    if not isinstance(app.backend, DisabledBackend):
        result_state = app.AsyncResult(task_id).state
        if result_state in _BACKEND_STATES:
            out["state"] = _BACKEND_STATES[result_state]
            out["result_state"] = result_state
    return out
