"""The remote-control commands a fair worker answers from its gate (job control, issue 22).

``fair_status``, ``fair_jobs``, ``fair_cancel`` and ``fair_reprioritize`` are Celery
remote-control commands,
registered when this module is imported (the gate's bootstep does); the clients that broadcast
them and read the answers are ``celery_fair.control``'s ``status``, ``jobs``, ``cancel`` and
``reprioritize`` (producer side), which says what each answer means.
"""

from __future__ import annotations

from typing import Any

from celery.utils.functional import maybe_list
from celery.worker.control import control_command, inspect_command
from celery.worker.control import revoke as celery_revoke

from ..errors import SchedulerError
from ..protocol import ControlAnswer

__all__ = ["fair_cancel", "fair_jobs", "fair_reprioritize", "fair_status"]


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


@inspect_command(  # type: ignore[untyped-decorator]
    args=[("key", str), ("job_state", str), ("type", str), ("limit", int)],
    signature="[key [job_state [type [limit]]]]",
)
def fair_jobs(
    state: Any,
    key: str | None = None,
    job_state: str | None = None,
    type: str | None = None,
    limit: int = 100,
    **kwargs: Any,
) -> dict[str, Any]:
    """The fair jobs this worker runs, has reserved or holds, filtered (worker side; views.py
    ``jobs``): ``{"jobs": [...], "matched": n}``, or ``{}`` (not a fair worker)."""
    gate = getattr(state.consumer, "fair_gate", None)
    if gate is None:
        return {}
    found, matched = gate.jobs(
        key=key or None, state=job_state or None, type=type or None, limit=limit
    )
    return {"jobs": found, "matched": matched}


@control_command(  # type: ignore[untyped-decorator]
    args=[("task_id", str), ("terminate", bool), ("signal", str)],
    signature="<task_id> [terminate [signal]]",
)
def fair_cancel(
    state: Any, task_id: str, terminate: bool = False, signal: str | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Revoke ``task_id`` as Celery's ``revoke`` does, then drop it from the gate if held
    (worker side). Answers ``{task_id: "cancelled" | "already_running"}``, or, for a job
    not here, ``{task_id: "revoked"}``: it is in this worker's revoked set, so dropped if it
    arrives."""
    celery_revoke(state, task_id, terminate=terminate, signal=signal)
    gate = getattr(state.consumer, "fair_gate", None)
    answer = gate.cancel(task_id) if gate is not None else None
    return {task_id: (answer or ControlAnswer.REVOKED).value}


@control_command(  # type: ignore[untyped-decorator]
    args=[("task_id", str), ("priority", int)],
    signature="<task_id> [priority]",
)
def fair_reprioritize(
    state: Any, task_id: str, priority: int | None = None, **kwargs: Any
) -> dict[str, Any]:
    """Give ``task_id`` the priority ``priority`` (``None``: its type's) if this worker holds
    it, else remember it for when it comes (worker side). Answers ``{task_id: "ok" |
    "already_running" | "remembered"}``, ``{task_id: {"error": ...}}`` for a priority
    refused, or ``{}`` (not a fair worker)."""
    gate = getattr(state.consumer, "fair_gate", None)
    if gate is None:
        return {}
    try:
        answer = gate.reprioritize(task_id, priority)
    except SchedulerError as exc:
        return {task_id: {"error": str(exc)}}
    return {task_id: (answer or ControlAnswer.REMEMBERED).value}
