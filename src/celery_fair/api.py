"""Producer side: ``@fair_task``, the ``FairTask`` base, and the fairness headers they publish."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

from celery import Celery, Task, shared_task
from celery.backends.base import DisabledBackend
from celery.canvas import Signature
from celery.exceptions import TimeoutError as CeleryTimeoutError
from kombu.utils.uuid import uuid

from .connect import declared_types, key_policies, settings_of
from .core import Aging, JobType
from .core.types import TYPE_OPTIONS, check_declared_priority, check_priority
from .errors import ConfigurationError, RunTimeout, SchedulerError
from .protocol import (
    FAIRNESS_KEY,
    JOB_ID,
    JOB_TYPE,
    ON_DEMAND,
    PRIORITY,
    SUBMITTED,
    check_text,
    header_text,
)
from .routing import Shards, resolve_base
from .submissions import submit_once, submit_tracked

__all__ = ["FairTask", "declared_types", "fair_headers", "fair_task", "send"]

F = TypeVar("F", bound=Callable[..., Any])

_FAIR_OPTIONS = TYPE_OPTIONS


def fair_headers(
    job_type: str | None = None,
    fairness_key: str | None = None,
    job_id: str | None = None,
    submitted: float | None = None,
    priority: int | None = None,
) -> dict[str, Any]:
    """The headers that make a message a fair job, for producers that only know plain Celery.
    ``priority`` is the job's own, if not its type's (see ``FairTask.apply_async``); without
    an app to read the declared priorities from, only its form is checked here, and a worker
    runs an undeclared one at the type's priority.

    Raises:
        MessageError: ``job_type``, ``fairness_key`` or ``job_id`` is not Unicode text.
        SchedulerError: ``priority`` is not a positive int.

    Example:
        >>> app.send_task("clone", ["linux"],
        ...               headers=fair_headers("sync-clone", "10.0.0.7", "linux"))  # doctest: +SKIP
    """
    for name, value in ((JOB_TYPE, job_type), (FAIRNESS_KEY, fairness_key), (JOB_ID, job_id)):
        check_text(name, value)
    headers: dict[str, Any] = {SUBMITTED: time.time() if submitted is None else submitted}
    if job_type is not None:
        headers[JOB_TYPE] = job_type
    if fairness_key is not None:
        headers[FAIRNESS_KEY] = fairness_key
    if job_id is not None:
        headers[JOB_ID] = job_id
    if priority is not None:
        check_priority(priority)
        headers[PRIORITY] = priority
    return headers


class FairTask(Task):
    """Base class of fair tasks: ``@app.task(base=FairTask, fair_type="clone", ...)``.

    Class attributes (all optional; a type may instead be declared in ``fair_types``):
        fair_type: The job type's name; defaults to the task's name.
        fair_priority, fair_max_concurrency, fair_conflict_group, fair_default_cost,
            fair_aging, fair_rate, fair_burst, fair_per: The job type's options (see
            ``celery_fair.JobType``; ``fair_aging`` as a mapping like the ``fair_aging``
            setting; ``fair_rate`` the type's rate fleet-wide, all keys together, unlike
            Celery's ``rate_limit``, which is per worker).

    Publishing takes two more options, ``fairness_key`` and ``job_id``. When ``fairness_key`` is
    not given, a task called from inside another fair task inherits its caller's key, so the
    work a client starts stays that client's.
    """

    #: Celery's default strategy, whose task-received events carry the fairness fields.
    Strategy = "celery_fair.worker.events:fair_strategy"

    fair_type: str | None = None
    fair_priority: int | None = None
    fair_max_concurrency: int | None = None
    fair_conflict_group: str | None = None
    fair_default_cost: float | None = None
    fair_aging: Any = None
    fair_rate: Any = None
    fair_burst: float | None = None
    fair_per: str | None = None

    @classmethod
    def job_type_name(cls) -> str:
        return cls.fair_type or cls.name

    @classmethod
    def declared_job_type(cls) -> JobType | None:
        """The job type this task declares, or ``None`` if it only names one."""
        options = {
            name: getattr(cls, f"fair_{name}")
            for name in _FAIR_OPTIONS
            if getattr(cls, f"fair_{name}") is not None
        }
        if not options:
            return None
        if "priority" not in options:
            raise ConfigurationError(
                f"task {cls.name!r}: job type {cls.job_type_name()!r} gives options but no priority"
            )
        try:
            if options.get("aging") is not None:
                options["aging"] = Aging.from_mapping(options["aging"])
            return JobType(cls.job_type_name(), **options)
        except ConfigurationError as exc:
            raise ConfigurationError(f"task {cls.name!r}: {exc}") from None

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        fairness_key: str | None = None,
        job_id: str | None = None,
        idempotency_key: str | None = None,
        fair_priority: int | None = None,
        **options: Any,
    ) -> Any:
        """Celery's ``apply_async`` with the fairness options: ``fairness_key`` (who asked),
        ``job_id`` (the resource the job works on), ``idempotency_key``: a duplicate of
        ``(fairness_key, idempotency_key)`` within ``fair_idempotency_seconds`` publishes
        nothing and returns the first submission's result once that one is published, or
        raises ``SubmissionPending`` if its outcome is not known in time (submissions.py), and
        ``fair_priority``: this job's own priority, if not its type's (its tier, where its
        aging starts; its type's cap still counts it): one a job type or ``fair_tier_caps``
        declares. Celery's own ``priority`` is the broker's, and the gate does not read it.

        Raises:
            MessageError: ``fairness_key``, ``job_id`` or the task id is not Unicode text
                (a lone surrogate, as ``json.loads('"\\ud800"')`` gives): nothing is
                published or recorded.
            SchedulerError: ``fair_priority`` is not a declared priority, or is above the
                fairness key's ``max_priority``: the same.
        """
        parent = super().apply_async

        def publish(tid: str | None, headers: dict[str, Any], opts: dict[str, Any]) -> Any:
            return parent(
                args, kwargs, tid, producer, link, link_error, shadow, headers=headers, **opts
            )

        own = getattr(self, "queue", None)  # the task's own queue, if it names one
        return _submit(
            self.app,
            publish,
            route=(self.name, args, kwargs, {"queue": own} if own else {}),
            job_type=self.job_type_name(),
            task_id=task_id,
            fairness_key=fairness_key,
            job_id=job_id,
            idempotency_key=idempotency_key,
            fair_priority=fair_priority,
            options=options,
            result=self.AsyncResult,
            one_job_time=_one_job_time(self.app, self.job_type_name(), job_id, type(self)),
        )

    def run_sync(
        self,
        args: Any = None,
        kwargs: Any = None,
        *,
        fairness_key: str | None = None,
        job_id: str | None = None,
        timeout: float | None = None,
        terminate: bool = False,
        interval: float = 0.05,
        **options: Any,
    ) -> Any:
        """Run the job through the fair scheduler and wait for its result (foreground work).

        It is published like ``apply_async`` (same headers, same scheduler, same caps and
        conflicts), marked on-demand (the ``fair_on_demand`` header: somebody waits for it),
        and its result is returned; the task's exception is raised. After ``timeout``
        seconds the job is cancelled (``terminate=True`` also stops it if it runs) and
        ``RunTimeout`` is raised. It needs a result backend: without one it raises
        ``ConfigurationError`` before publishing anything.

        Example:
            >>> clone.run_sync(["linux"], fairness_key=request.remote_addr,
            ...                job_id="linux", timeout=30)  # doctest: +SKIP
        """
        if isinstance(self.backend, DisabledBackend):
            raise ConfigurationError(
                f"{self.name}.run_sync needs a result backend to wait on (Celery's "
                "result_backend setting); none is configured"
            )
        headers = {**(options.pop("headers", None) or {}), ON_DEMAND: True}
        result = self.apply_async(
            args, kwargs, fairness_key=fairness_key, job_id=job_id, headers=headers, **options
        )
        try:
            return result.get(timeout=timeout, interval=interval)
        except CeleryTimeoutError:
            from .control import cancel

            answer = cancel(self.app, result.id, terminate=terminate)
            raise RunTimeout(result.id, timeout or 0.0, answer["state"]) from None

    def fair(
        self,
        fairness_key: str | None = None,
        job_id: str | None = None,
        priority: int | None = None,
    ) -> Signature:
        """A signature carrying the fairness options: ``task.fair("10.0.0.7", "linux").delay()``
        (``priority``: the job's own, ``fair_priority`` of ``apply_async``)."""
        options: dict[str, Any] = {}
        if fairness_key is not None:
            options["fairness_key"] = fairness_key
        if job_id is not None:
            options["job_id"] = job_id
        if priority is not None:
            check_priority(priority)
            options["fair_priority"] = priority
        return self.signature(options=options)


def send(
    app: Celery,
    name: str,
    args: Any = None,
    kwargs: Any = None,
    *,
    job_type: str | None = None,
    fairness_key: str | None = None,
    job_id: str | None = None,
    idempotency_key: str | None = None,
    fair_priority: int | None = None,
    task_id: str | None = None,
    **options: Any,
) -> Any:
    """``app.send_task`` for a fair job named ``name``, through the fair task's own submit
    path: its headers (as ``fair_headers`` writes them), its key's shard or lane, and the
    submit controls of ``FairTask.apply_async``: ``idempotency_key`` (one publish per
    ``(fairness_key, idempotency_key)`` within ``fair_idempotency_seconds``), the registry
    of submissions (``fair_track_submits``) and its limits (``fair_max_queued``,
    ``fair_max_queued_per_key``: ``QueueFull``). For a producer that does not
    import the task's code. ``job_type``: the type's name, by default the type of the fair
    task registered here as ``name``, if any (a worker takes a message without one as of its
    task's type). Other options are Celery's own ``send_task`` options.

    Raises:
        MessageError: ``fairness_key``, ``job_id``, ``job_type`` or ``task_id`` is not
            Unicode text: nothing is published or recorded.
        SchedulerError: ``fair_priority`` is not a declared priority, or is above the
            fairness key's ``max_priority``: the same.
        QueueFull, StoreUnavailable, SubmissionPending: as ``FairTask.apply_async``.

    Example:
        >>> send(app, "repos.clone", ["linux"], job_type="sync-clone",
        ...      fairness_key="10.0.0.7", job_id="linux", idempotency_key="r42")  # doctest: +SKIP
    """
    check_text(JOB_TYPE, job_type)
    task = app.tasks.get(name)
    fair = type(task) if isinstance(task, FairTask) else None
    if job_type is None and fair is not None:
        job_type = fair.job_type_name()

    def publish(tid: str | None, headers: dict[str, Any], opts: dict[str, Any]) -> Any:
        return app.send_task(name, args, kwargs, task_id=tid, headers=headers, **opts)

    own = getattr(task, "queue", None) if task is not None else None
    return _submit(
        app,
        publish,
        route=(name, args, kwargs, {"queue": own} if own else {}),
        job_type=job_type,
        task_id=task_id,
        fairness_key=fairness_key,
        job_id=job_id,
        idempotency_key=idempotency_key,
        fair_priority=fair_priority,
        options=options,
        result=app.AsyncResult,
        one_job_time=_one_job_time(app, job_type, job_id, fair),
    )


def _submit(
    app: Celery,
    publish: Callable[[str | None, dict[str, Any], dict[str, Any]], Any],
    *,
    route: tuple[str, Any, Any, dict[str, Any]],
    job_type: str | None,
    task_id: str | None,
    fairness_key: str | None,
    job_id: str | None,
    idempotency_key: str | None,
    fair_priority: int | None,
    options: dict[str, Any],
    result: Callable[[str], Any],
    one_job_time: Callable[[Any], float],
) -> Any:
    """The one submit path of a fair job (``FairTask.apply_async`` and ``send``): its
    headers, its key's shard or lane of the queue Celery would use (``route``: the task's
    name, its arguments, and its own queue option), then ``publish(task_id, headers,
    options)``, through the idempotency record and the queue limits when asked for. Nothing
    is published or recorded when a check refuses."""
    headers = dict(options.pop("headers", None) or {})
    if fair_priority is not None:
        check_declared_priority(fair_priority, _declared_priorities(app))
        headers[PRIORITY] = fair_priority
    if job_type is not None:
        headers.setdefault(JOB_TYPE, job_type)
    if fairness_key is not None:
        headers[FAIRNESS_KEY] = fairness_key
    elif FAIRNESS_KEY not in headers:
        inherited = _current_fairness_key()
        if inherited is not None:
            headers[FAIRNESS_KEY] = inherited
    if job_id is not None:
        headers[JOB_ID] = job_id
    for header in (FAIRNESS_KEY, JOB_ID):  # before the shard hash or the store meets them
        check_text(header, headers.get(header))
    if fair_priority is not None:
        _check_bound(app, _key_of(app, headers.get(FAIRNESS_KEY)), fair_priority)
    check_text("task_id", options.get("task_id", task_id))
    # A retry keeps the first submission time: the job has waited that long already.
    if SUBMITTED not in headers:
        retry = bool(options.get("retries")) and options.get("task_id", task_id) is not None
        inherited_clock = _inherited_submitted(app, retry)
        headers[SUBMITTED] = time.time() if inherited_clock is None else inherited_clock
    key = headers.get(FAIRNESS_KEY)
    if isinstance(key, str) and key:
        shards = Shards.of(app)
        count = shards.count  # fair_shards, read once for this publish
        if count > 1:
            # To its key's shard of the queue Celery would use (a retry comes with its shard).
            name, args, kwargs, own = route
            base = resolve_base(app, name, args, kwargs, {**own, **options})
            shards.route(options, key, base, count)
    tracking = settings_of(app).tracking
    if idempotency_key is None and not tracking:
        return publish(task_id, headers, options)
    tid = task_id or uuid()
    fairness = _key_of(app, headers.get(FAIRNESS_KEY))

    def send() -> Any:
        return publish(tid, headers, options)

    def send_tracked() -> Any:
        return submit_tracked(app, fairness, tid, send, one_job_time)

    submit = send_tracked if tracking else send
    if idempotency_key is None:
        return submit()
    return submit_once(app, fairness, idempotency_key, tid, submit, result)


def _one_job_time(
    app: Celery, name: str | None, job_id: str | None, task: type[FairTask] | None
) -> Callable[[Any], float]:
    """``QueueFull.retry_after``: the fleet's learned estimate of one job of type ``name``
    (on this resource), else the type's default cost (as ``task`` or ``fair_types``
    declares it), else 1 s."""

    def hint(store: Any) -> float:
        declared = task.declared_job_type() if task is not None else None
        if declared is None and name is not None:
            declared = settings_of(app).types.get(name)
        default = declared.default_cost if declared is not None else 1.0
        if name is None:
            return float(default)
        try:
            return float(store.estimate(name, job_id, default))
        except Exception:  # a hint only: the refusal stands without one
            return float(default)

    return hint


def _check_bound(app: Celery, fairness_key: str, priority: int) -> None:
    """Refuse ``priority`` above ``fairness_key``'s ``max_priority`` (``fair_keys`` and the
    runtime policies as this producer last read them; with ``fair_key_separator``, the lower
    of its own and its tenant's): the worker would lower it."""
    bound = key_policies(app).bound(fairness_key, settings_of(app).key_separator)
    if bound is not None and priority > bound:
        raise SchedulerError(
            f"fair_priority {priority} is above fairness key {fairness_key!r}'s "
            f"max_priority {bound}: give {bound} or less, or no fair_priority"
        )


def _declared_priorities(app: Celery) -> frozenset[int]:
    """The priorities a job's own priority may take, as far as this app knows: its
    ``fair_types``, its ``fair_tier_caps`` and the types its fair tasks declare."""
    types = list(settings_of(app).types.values())
    for task in list(app.tasks.values()):
        if isinstance(task, FairTask):
            declared = type(task).declared_job_type()
            if declared is not None:
                types.append(declared)
    return frozenset(settings_of(app).declared_priorities(types))


def _key_of(app: Celery, header: object) -> str:
    """The fairness key a worker will read from ``header``: the default one when absent."""
    if isinstance(header, str):
        return header
    return str(app.conf.get("fair_default_fairness_key", "") or "")


def _inherited_submitted(app: Celery, retry: bool) -> float | None:
    """The aging clock (first submission time) of the fair task running here, for a message
    it publishes: its own retry (the clock goes on across retries), or, with
    ``fair_inherit_aging``, any fair task (which then starts where its caller has risen to).
    ``None`` otherwise: a new job's clock starts now."""
    if not retry and not settings_of(app).inherit_aging:  # (a missing key: 14 µs in conf)
        return None
    from celery import current_task

    request = getattr(current_task, "request", None)
    if request is None or not isinstance(current_task, FairTask):
        return None
    stamp = getattr(request, SUBMITTED, None)
    if stamp is None:
        stamp = (getattr(request, "headers", None) or {}).get(SUBMITTED)
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)):
        return None
    return float(stamp)


def _current_fairness_key() -> str | None:
    from celery import current_task

    request = getattr(current_task, "request", None)
    if request is None:
        return None
    return header_text(getattr(request, FAIRNESS_KEY, None))  # a bad one is not passed on


def fair_task(
    *args: Any,
    type: str | None = None,
    priority: int | None = None,
    max_concurrency: int | None = None,
    conflict_group: str | None = None,
    default_cost: float | None = None,
    aging: Any = None,
    rate: Any = None,
    burst: float | None = None,
    per: str | None = None,
    app: Celery | None = None,
    base: type[FairTask] = FairTask,
    **task_options: Any,
) -> Any:
    """Declare a fair task, bound to the current app like ``shared_task`` (or to ``app`` only).

    ``rate``, ``burst`` and ``per`` limit how fast the type's jobs start across the fleet, all
    fairness keys together (as in ``fair_keys``; docs/configuration.md); Celery's own
    ``rate_limit`` still works beside them, per worker.

    In canvas, give the options to the signature: ``clone.s("linux").set(fairness_key="k",
    job_id="linux")``; every primitive (chain, group, chord) passes them on.

    Example:
        >>> @fair_task(type="sync-clone", priority=8, conflict_group="git", default_cost=10)
        ... def clone(repo): ...                                         # doctest: +SKIP
        >>> clone.apply_async(["linux"], fairness_key="10.0.0.7", job_id="linux")  # doctest: +SKIP
    """
    fair_options = {
        "fair_type": type,
        "fair_priority": priority,
        "fair_max_concurrency": max_concurrency,
        "fair_conflict_group": conflict_group,
        "fair_default_cost": default_cost,
        "fair_aging": aging,
        "fair_rate": rate,
        "fair_burst": burst,
        "fair_per": per,
    }
    options = {k: v for k, v in fair_options.items() if v is not None}
    options.update(task_options)

    def create(fun: F) -> Any:
        if app is None:
            return shared_task(base=base, **options)(fun)
        # Bound to one app on purpose: unlike app.task, do not add it to every other app.
        options.setdefault("shared", False)
        return app.task(base=base, **options)(fun)

    if len(args) == 1 and callable(args[0]) and not task_options.get("name"):
        return create(args[0])
    if args:
        raise TypeError("fair_task() takes keyword options only, e.g. @fair_task(type='clone')")
    return create
