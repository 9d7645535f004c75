"""Consumer bootstep that puts the fair gate between the consumer and the pool."""

from __future__ import annotations

from typing import Any

from celery import bootsteps
from celery.utils.log import get_logger

from .gate import Gate

__all__ = ["FairGateStep"]

logger = get_logger(__name__)


class FairGateStep(bootsteps.StartStopStep):
    """Install the gate as ``consumer.on_task_request``; sweep while connected.

    The consumer's strategies capture ``on_task_request`` when ``Tasks`` starts, and its ETA
    and rate-limit paths look it up when they fire, so replacing it here (in ``__init__``,
    before anything starts) puts every request through the gate.
    """

    label = "Fair gate"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        controller = c.controller
        settings = getattr(controller, "fair_settings", None)
        types = getattr(controller, "fair_types", None)
        self.gate: Gate | None = None
        if settings is None or types is None or not hasattr(c.pool, "fair_gate"):
            logger.warning("Fair gate not installed: the pool is not the fair pool.")
            return
        self.gate = Gate(c, settings, types, c.on_task_request)
        c.on_task_request = self.gate.on_request
        c.pool.fair_gate = self.gate
        c.fair_gate = self.gate

    def start(self, c: Any) -> None:
        gate = self.gate
        if gate is not None:
            gate.consumer = c
            gate.pool = c.pool
            gate.on_connected()
            self._entry = c.timer.call_repeatedly(gate.settings.sweep_interval, gate.sweep)

    def stop(self, c: Any) -> None:
        entry = getattr(self, "_entry", None)
        if entry is not None:
            entry.cancel()
            self._entry = None
        if self.gate is not None:
            self.gate.on_connection_lost()

    def shutdown(self, c: Any) -> None:
        self.stop(c)

    def info(self, c: Any) -> dict[str, Any]:
        return {} if self.gate is None else {"fair": self.gate.pool_info()}
