"""Job control of the jobs one gate has: cancel and reprioritise (issue 22), with the answers
the ``fair_cancel`` and ``fair_reprioritize`` commands send back (worker/control.py), which
``celery_fair.control`` reads (and says what each means).

A job is found by the task id a user knows, held, reserved or running (``HeldJobs.uid_of``).
No lock of its own: the gate calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Callable

from celery.utils.log import get_logger

from ..core import PriorityOutcome
from ..core.types import check_priority
from ..engine import Engine
from ..observe import Observer
from ..protocol import ControlAnswer
from .held import HeldJobs
from .reserve import Reserve
from .runs import Runs

__all__ = ["JobControl"]

logger = get_logger(__name__)


class JobControl:
    """Cancel and reprioritise one gate's jobs. ``forget`` stops holding a job (withdrawn, or
    its admission given back); ``dispatch`` decides again."""

    def __init__(
        self,
        held: HeldJobs,
        reserve: Reserve,
        runs: Runs,
        engine: Engine,
        observer: Observer,
        *,
        forget: Callable[[str], None],
        dispatch: Callable[[], None],
    ) -> None:
        self._held = held
        self._reserve = reserve
        self._runs = runs
        self._engine = engine
        self._observer = observer
        self._forget = forget
        self._dispatch = dispatch

    def cancel(self, task_id: str) -> ControlAnswer | None:
        """Cancel job ``task_id`` if this worker has it. O(1).

        Call it once ``task_id`` is in Celery's revoked set (the ``fair_cancel`` command puts
        it there first). A held or reserved job is dropped at once the way Celery drops a
        revoked message (acked, marked revoked in the result backend, a ``task-revoked``
        event) and its key gets back whatever its admission was charged: ``CANCELLED``. A job
        handed to the pool is ``ALREADY_RUNNING`` (one still waiting for a pool process is
        dropped at the pool's door, refunded, as Celery's revoke does). ``None``: not here.
        """
        answer = self._cancel(task_id)
        self._observer.controlled("cancel", answer.value if answer else "elsewhere")
        return answer

    def _cancel(self, task_id: str) -> ControlAnswer | None:
        uid = self._held.uid_of(task_id)
        if uid in self._runs.fair:
            return ControlAnswer.ALREADY_RUNNING
        held = self._held.get(uid)
        if held is None or not held.req.revoked():  # not here, or not in the revoked set
            return None
        self._forget(uid)
        self._observer.revoked_held()
        logger.info("Held task %s[%s] was cancelled; dropped from the gate.", held.req.name, uid)
        self._dispatch()  # a reserved job's slot may be free now
        return ControlAnswer.CANCELLED

    def reprioritize(self, task_id: str, priority: int | None) -> ControlAnswer | None:
        """Give job ``task_id`` the priority ``priority`` (``None``: its type's) if it has not
        started. O(log held).

        A held job moves at once (``Engine.reprioritize``: it is taken as arriving now) and
        may start at this very decision: ``OK``. A job admitted or running is
        ``ALREADY_RUNNING``. ``None``: not here; the priority is then remembered for it
        (``HeldJobs.remember``), so that it takes it if it arrives later: a job still in the
        broker, or redelivered here when the worker holding it dies.

        Raises:
            SchedulerError: ``priority`` is not ``None`` or a positive int.
        """
        check_priority(priority)
        answer = self._reprioritize(task_id, priority)
        self._observer.controlled("reprioritize", answer.value if answer else "elsewhere")
        return answer

    def _reprioritize(self, task_id: str, priority: int | None) -> ControlAnswer | None:
        uid = self._held.uid_of(task_id)
        if uid in self._runs.fair or uid in self._reserve:
            return ControlAnswer.ALREADY_RUNNING
        held = self._held.get(uid)
        if held is None:
            self._held.remember(task_id, priority)
            return None
        outcome = self._engine.reprioritize(uid, priority)
        if outcome is PriorityOutcome.RUNNING:
            return ControlAnswer.ALREADY_RUNNING
        if outcome is not PriorityOutcome.OK:
            return None
        held.priority = priority
        logger.info("Held task %s[%s] now has priority %s.", held.req.name, uid, priority)
        self._dispatch()  # it may go first now
        return ControlAnswer.OK
