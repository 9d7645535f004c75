"""The consumer bootsteps of a fair worker: the gate between the consumer and the pool, and
around it the metrics server, the intake, the store link and the sweep, each a small step
with ``requires`` (``STEPS``). Steps share what they make through the consumer (``c.fair_gate``,
``c.fair_metrics``, ``c.fair_intake``), as Celery's own steps share ``c.connection``; none sets
another's attributes."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from celery import bootsteps
from celery.utils.log import get_logger
from kombu.utils.url import maybe_sanitize_url

from ..connect import open_store, store_url
from ..core import JobType, Scheduler, WallClock
from ..core.clock import MonotonicClock
from ..engine import Engine
from ..metrics import GateLook, WorkerMetrics, serve
from ..observe import Counters, Fanout, Observer
from ..redis_broker import redis_broker_client, redis_queue_lists
from ..routing import Lanes, Shards, follow_consumer_changes, is_part
from ..settings import FairSettings
from ..store.base import Store
from . import control  # noqa: F401 - registers the fair_* remote-control commands
from .consumer_prefetch import ShardWindows
from .gate import Gate
from .intake import Intake, IntakeThread, RedisIntake
from .intake.amqp import AmqpIntake
from .internals import note_redis_sources, order_redis_reads, pack_scripts_once
from .lane_watch import LaneWatch, amqp_ready, redis_ready
from .reserve import RESERVE_MAX, plan_reserve, slots_of

# open_store and store_url are the app glue's (connect.py); named here too, as before.
__all__ = [
    "STEPS",
    "FairGateStep",
    "FairIntakeStep",
    "FairMetricsStep",
    "FairStoreLinkStep",
    "FairSweepStep",
    "gate_for_worker",
    "open_store",
    "startup_line",
    "store_url",
]

logger = get_logger(__name__)


def startup_line(
    *,
    worker: str,
    pool: str,
    slots: int,
    reserve: tuple[int, int],
    store: str | None,
    prefix: str,
    shards: int,
    queues: list[str],
) -> str:
    """The one line a fair worker says at startup: the pool inside, its slots and the reserve
    apart, the store, the shards.

    Example:
        >>> print(startup_line(worker="w1@h", pool="prefork", slots=2, reserve=(1, 8),
        ...     store=None, prefix="celery_fair", shards=8, queues=["celery"]))
        celery-fair: -P fair on w1@h: prefork pool inside, 2 slots and a reserve of 1 to 8 \
(adaptive); no shared store (this worker decides alone); 8 shards per queue (celery)
    """
    low, high = reserve
    if high == 0:
        ahead = "no reserve"
    elif low == high:
        ahead = f"a reserve of {low}"
    else:
        ahead = f"a reserve of {low} to {high} (adaptive)"
    where = (
        "no shared store (this worker decides alone)"
        if store is None
        else f"store {_masked(store)} (prefix {prefix})"
    )
    sharded = f"{shards} shards per queue ({', '.join(queues)})" if shards > 1 else "no shards"
    return (
        f"celery-fair: -P fair on {worker}: {pool} pool inside, {slots} slots and {ahead}; "
        f"{where}; {sharded}"
    )


def _masked(url: str) -> str:
    """``url`` with its passwords masked (each of a Sentinel URL's ``;``-separated parts)."""
    try:
        return ";".join(maybe_sanitize_url(part) for part in url.split(";"))
    except ValueError:
        return url.partition("://")[0] + "://..."


def announce(controller: Any, line: str) -> None:
    """Say ``line`` once, where the worker's own startup banner is seen: logged at INFO when the
    worker logs INFO, else (the default, WARNING) printed under the banner, as the banner is;
    nothing with ``--quiet``, which hides the banner too."""
    level = getattr(controller, "loglevel", None)
    if isinstance(level, int) and level > logging.INFO:
        if not getattr(controller, "quiet", False):
            print(line, file=sys.__stdout__, flush=True)
    else:
        logger.info("%s", line)


def start_intake(
    c: Any, settings: FairSettings, observer: Observer | None = None
) -> IntakeThread | None:
    """With shards, the intake of the queues this worker consumes: fair messages that
    producers published to a queue move into their shards (intake/)."""
    shards = Shards.of(c.app)
    if settings.intake_interval is None or not shards.enabled:
        return None
    driver = c.connection.transport.driver_type
    intake: Intake
    if driver == "redis":
        channel = c.connection.default_channel
        client = redis_broker_client(channel)
        pack_scripts_once(client)  # its script names every shard and lane of a queue
        lanes = Lanes.of(c.app) if shards.consumed_lanes else None
        intake = RedisIntake(
            client, redis_queue_lists(channel), shards.count, lanes, shards.consumed_lanes
        )
    elif driver == "amqp":
        intake = AmqpIntake(c.app)
    else:
        return None
    thread = IntakeThread(
        intake,
        lambda: _base_queues(c.app),
        settings.intake_interval,
        c.app,
        observer,
        lanes=shards.consumed_lanes > 0,
    )
    thread.start()
    logger.info(
        "celery-fair intake: moving fair messages from %s into their shards.",
        ", ".join(_base_queues(c.app)),
    )
    return thread


def _base_queues(app: Any) -> list[str]:
    """The queues (not shards) this worker consumes now; read from the intake's thread while
    ``add_consumer`` may change them on the loop's."""
    for _ in range(3):
        try:
            return [name for name in list(app.amqp.queues.consume_from) if not is_part(name)]
        except RuntimeError:  # changed while copied
            continue
    return []


def _fair(c: Any) -> tuple[Any, Any]:
    """The worker's fair settings and job types, or ``(None, None)`` if its pool is not the
    fair pool (pool.py's worker hook puts them on the worker)."""
    controller = c.controller
    settings = getattr(controller, "fair_settings", None)
    types = getattr(controller, "fair_types", None)
    if settings is None or types is None or not hasattr(c.pool, "fair_gate"):
        return None, None
    return settings, types


def _gate(c: Any) -> Gate | None:
    return getattr(c, "fair_gate", None)


class FairMetricsStep(bootsteps.StartStopStep):
    """With ``fair_metrics_port``, the worker's Prometheus metrics: what the gate reports to
    (``c.fair_metrics``, given to the gate when it is built) and the server that serves them
    from this main process (``c.fair_metrics_port`` once it serves)."""

    label = "Fair metrics"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings, _ = _fair(c)
        self.settings = settings
        self.metrics: WorkerMetrics | None = None
        self._server: Any = None
        c.fair_metrics = c.fair_metrics_port = None
        if settings is not None and settings.metrics_port is not None:
            self.metrics = c.fair_metrics = WorkerMetrics(
                look=lambda: gate.look() if (gate := _gate(c)) is not None else GateLook(),
                worker=c.hostname,
                top_keys=settings.metrics_top_keys,
            )

    def start(self, c: Any) -> None:
        """Serve the metrics (once); a port in use is logged, not fatal: the worker runs on
        without them."""
        settings = self.settings
        if self.metrics is None or self._server is not None:
            return
        try:
            server, port = serve(self.metrics, settings.metrics_port or 0, settings.metrics_address)
        except OSError as exc:
            logger.error(
                "celery-fair: cannot serve metrics on %s:%s (%s); running without them.",
                settings.metrics_address,
                settings.metrics_port,
                exc,
            )
            self.metrics = None
            return
        self._server = server
        c.fair_metrics_port = port
        logger.info(
            "celery-fair: Prometheus metrics at http://%s:%d/metrics",
            settings.metrics_address,
            port,
        )

    def shutdown(self, c: Any) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class FairIntakeStep(bootsteps.StartStopStep):
    """With shards, the intake of the queues this worker consumes (``start_intake``), started
    with the first connection and stopped at shutdown; ``c.fair_intake`` says whether it
    runs."""

    label = "Fair intake"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.settings, _ = _fair(c)
        self.intake: IntakeThread | None = None
        c.fair_intake = False
        c.fair_reroute = None

    def start(self, c: Any) -> None:
        gate = _gate(c)
        if self.settings is None or gate is None or self.intake is not None:
            return
        self.intake = start_intake(c, self.settings, gate.observer)
        c.fair_intake = self.intake is not None
        c.fair_reroute = self.intake.reroute_soon if self.intake is not None else None

    def shutdown(self, c: Any) -> None:
        if self.intake is not None:
            self.intake.stop()


class FairGateStep(bootsteps.StartStopStep):
    """Install the gate as ``consumer.on_task_request`` (``c.fair_gate``), and give it what it
    acts through on each connection.

    The consumer's strategies capture ``on_task_request`` when ``Tasks`` starts, and its ETA
    and rate-limit paths look it up when they fire, so replacing it here (in ``__init__``,
    before anything starts) puts every request through the gate. It starts after the metrics
    and the intake, whose ports and state it is given, and before the store link and the sweep,
    which act on it.
    """

    label = "Fair gate"
    requires = ("celery.worker.consumer.tasks:Tasks", FairMetricsStep, FairIntakeStep)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        settings, types = _fair(c)
        self.gate: Gate | None = None
        self._announced = False
        c.fair_gate = None
        if settings is None:
            logger.warning("Fair gate not installed: the pool is not the fair pool.")
            return
        self.gate = c.fair_gate = c.pool.fair_gate = gate_for_worker(
            c,
            settings,
            types,
            c.on_task_request,
            store=getattr(c.controller, "fair_store", None),
            worker_id=f"{c.hostname}/{os.getpid()}/{uuid.uuid4().hex[:6]}",
            observer=getattr(c, "fair_metrics", None),
        )
        c.on_task_request = self.gate.on_request
        follow_consumer_changes(c)

    def start(self, c: Any) -> None:
        gate = self.gate
        if gate is None:
            return
        windows = None
        if Shards.of(c.app).enabled:
            windows = ShardWindows.install(c, gate.windows.shard_window)
            if gate.windows.turns is not None and c.task_consumer is not None:
                order_redis_reads(c.task_consumer.channel, gate.windows.turns.order)
                if gate.lanes is not None:  # a message counts in the list it was read from
                    note_redis_sources(c.task_consumer.channel, gate.lanes.read_from)
        # Everything the gate acts through on this connection, given before it starts: the
        # step never sets the gate's attributes.
        gate.attach(
            c,
            c.pool,
            shard_windows=windows,
            intake_running=bool(getattr(c, "fair_intake", False)),
            reroute=getattr(c, "fair_reroute", None),
            metrics_port=getattr(c, "fair_metrics_port", None),
        )
        gate.on_connected()
        if not self._announced:
            self._announced = True
            announce(c.controller, self._startup_line(c, gate))

    def stop(self, c: Any) -> None:
        if self.gate is not None:
            self.gate.on_connection_lost()

    def shutdown(self, c: Any) -> None:
        self.stop(c)
        if self.gate is not None:
            self.gate.close()

    def info(self, c: Any) -> dict[str, Any]:
        return {} if self.gate is None else {"fair": self.gate.pool_info()}

    def _startup_line(self, c: Any, gate: Gate) -> str:
        settings = gate.settings
        low = high = gate.lookahead
        if gate.reserve.adaptive:
            high = RESERVE_MAX
        shards = Shards.of(c.app)
        return startup_line(
            worker=c.hostname,
            pool=settings.pool,
            slots=gate.pool_slots,
            reserve=(low, high),
            store=None if gate.engine.store is None else store_url(settings, c.app),
            prefix=settings.store_prefix,
            shards=shards.count,
            queues=_base_queues(c.app),
        )


class FairStoreLinkStep(bootsteps.StartStopStep):
    """With the event loop, the gate's store calls go on it without blocking it (pacing.py);
    the gate closes the link at shutdown."""

    label = "Fair store link"
    requires = (FairGateStep,)

    def start(self, c: Any) -> None:
        gate = _gate(c)
        if gate is not None:
            gate.start_link(c.hub)


class FairSweepStep(bootsteps.StartStopStep):
    """While connected, the gate's sweep every ``fair_sweep_interval`` (housekeeping.py), and
    with a shared store a decision every ``fair_store_poll_interval``, which looks at the store
    while jobs wait for other workers, beats and retries."""

    label = "Fair sweep"
    requires = (FairGateStep,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self._entries: list[Any] = []

    def start(self, c: Any) -> None:
        gate = _gate(c)
        if gate is None:
            return
        settings = gate.settings
        self._entries.append(c.timer.call_repeatedly(settings.sweep_interval, gate.sweep))
        if gate.engine.store is not None:
            interval = settings.store_poll_interval
            self._entries.append(c.timer.call_repeatedly(interval, gate.dispatch))

    def stop(self, c: Any) -> None:
        for entry in self._entries:
            entry.cancel()
        self._entries.clear()

    def shutdown(self, c: Any) -> None:
        self.stop(c)


class FairLanesStep(bootsteps.StartStopStep):
    """With a shared store and lanes (``fair_lanes``), the lane watch (lane_watch.py): this
    worker's lanes and which of them are empty, told to the store about once a second; started
    with the first connection, stopped at shutdown."""

    label = "Fair lanes"
    requires = (FairGateStep,)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.watch: LaneWatch | None = None

    def start(self, c: Any) -> None:
        gate = _gate(c)
        lanes = Shards.of(c.app).consumed_lanes
        if gate is None or gate.engine.store is None or lanes < 1 or self.watch is not None:
            return
        driver = c.connection.transport.driver_type
        close: Callable[[], None] = lambda: None  # noqa: E731
        if driver == "redis":
            channel = c.connection.default_channel
            client = redis_broker_client(channel)
            ready = redis_ready(client, redis_queue_lists(channel))
            close = client.close
        elif driver == "amqp":
            conn = c.app.connection_for_read()
            ready = amqp_ready(conn)
            close = conn.release
        else:
            return
        self.watch = LaneWatch(
            gate.engine.store,
            gate.engine.worker,
            lanes,
            lambda: _base_queues(c.app),
            ready,
            close,
            refresh=Lanes.of(c.app).current,
            renew=gate.lanes.backlogged_keys if gate.lanes is not None else list,
        )
        self.watch.start()

    def shutdown(self, c: Any) -> None:
        if self.watch is not None:
            self.watch.stop()


#: The consumer steps of a fair worker, in the order they start (each requires the one before
#: it runs on): pool.py adds them to the app's consumer blueprint.
STEPS = (
    FairMetricsStep,
    FairIntakeStep,
    FairGateStep,
    FairStoreLinkStep,
    FairSweepStep,
    FairLanesStep,
)


def gate_for_worker(
    consumer: Any,
    settings: Any,
    types: Mapping[str, JobType],
    process_task: Callable[[Any], Any],
    store: Store | None = None,
    worker_id: str = "worker",
    observer: Observer | None = None,
) -> Gate:
    """The gate of a real worker's consumer: its scheduler on the wall clock, its engine
    over ``store`` (``None``: this worker decides alone), reporting to the gate's counters
    and ``observer``, and the real clocks."""
    wall = WallClock()
    lookahead, sizer = plan_reserve(settings, consumer.pool, shared=store is not None)
    scheduler = Scheduler(
        settings.scheduler_config(slots_of(consumer.pool, settings) + lookahead),
        wall,
        types.values(),
    )
    counters = Counters()
    fanout: Observer = counters if observer is None else Fanout(counters, observer)
    engine = Engine(
        scheduler,
        store,
        worker=worker_id,
        outage=settings.store_outage,
        poll_interval=settings.store_poll_interval,
        observer=fanout,
    )
    gate = Gate(
        consumer,
        settings,
        types,
        process_task,
        scheduler=scheduler,
        engine=engine,
        counters=counters,
        observer=fanout,
        driver=consumer.app.connection_for_read().transport.driver_type,
        lookahead=lookahead,
        sizer=sizer,
        wall=wall,
        monotonic=MonotonicClock(),
    )
    logger.info(
        "celery-fair gate ready: %d job type(s), max_held=%d, max_hold=%.0fs, state=%s, "
        "settings=%r",
        len(types),
        settings.max_held,
        gate.max_hold,
        f"shared as {worker_id}" if store is not None else "this worker alone",
        settings.describe(),
    )
    return gate
