"""How a gate reads a request's fairness headers: parsed by the worker's settings
(headers.py), with what was wrong logged and counted.

A bad header is logged with every message that has one (it is repaired, or the message goes
to the dead letter queue); a header out of its bounds (a ``fair_submitted`` beyond the horizon,
an undeclared ``fair_priority``), which a producer may send with every message, is counted
every time and logged once per episode (``Episodes``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery.utils.log import get_logger

from ..core import JobType
from ..observe import Observer
from .episodes import Episodes
from .headers import PRIORITY, SUBMITTED, FairHeaders, parse_headers

__all__ = ["BOUNDED_QUIET_SECONDS", "HeaderReader"]

logger = get_logger(__name__)

#: Seconds without a bounded header after which the next one is logged again.
BOUNDED_QUIET_SECONDS = 300.0
#: What the gate does with a header out of bounds, for its warning.
BOUNDED_OUTCOME = {
    SUBMITTED: "its wait counts from fair_submitted_horizon_seconds before its receipt",
    PRIORITY: "it runs at its type's priority",
}


class HeaderReader:
    """Reads the fairness headers of the requests one gate takes."""

    def __init__(self, settings: Any, types: Mapping[str, JobType], observer: Observer) -> None:
        self.settings = settings
        # groups: every job type's conflict group ("" for none), as parse_headers takes them.
        self.groups = {name: t.conflict_group for name, t in types.items()}
        # declared: the priorities a job's own fair_priority may take (any other is repaired
        # to its type's).
        self._declared = settings.declared_priorities(types.values())
        self._observer = observer
        self._bounds = Episodes(BOUNDED_QUIET_SECONDS)

    def read(self, req: Any, wall: float, monotonic: float) -> FairHeaders | None:
        """The fairness headers of ``req`` received at ``wall`` (epoch seconds; ``monotonic``
        on the gate's other clock), or ``None`` for a plain task. With ``rejected`` set the
        message must go to the dead letter queue (logged here); else what was repaired is
        logged and counted."""
        settings = self.settings
        declared = getattr(type(req.task), "job_type_name", None)
        parsed = parse_headers(
            req.request_dict,
            declared_type=declared() if declared else None,
            types=self.groups,
            default_key=settings.default_fairness_key,
            max_length=settings.max_header_length,
            reject_all=settings.on_bad_message == "reject",
            received=wall,
            horizon=settings.submitted_horizon_seconds,
            priorities=self._declared,
        )
        if parsed is None:
            return None
        if parsed.problems:
            logger.warning(
                "Task %s[%s] has bad fairness headers (%s); %s.",
                req.name,
                req.id,
                "; ".join(map(str, parsed.problems)),
                "sending it to the dead letter queue" if parsed.rejected else "repaired",
            )
        if parsed.rejected:
            return parsed
        for problem in parsed.problems:
            self._observer.repaired(problem.header)
        for problem in parsed.bounded:
            self._observer.repaired(problem.header)
            if self._bounds.due(problem.header, monotonic):
                logger.warning(
                    "Task %s[%s]: %s; %s (counted in fair-repaired; logged again after "
                    "%.0f s without another).",
                    req.name,
                    req.id,
                    problem,
                    BOUNDED_OUTCOME.get(problem.header, "repaired"),
                    self._bounds.quiet,
                )
        return parsed
