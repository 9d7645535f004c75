"""``-P fair``: a pool that is the real pool (prefork, threads, solo, ...) plus a gate.

Celery has no entry point for pools and checks ``-P`` against a list taken when its CLI module
is imported, so importing celery-fair (which the app module does) registers the ``fair`` alias
and adds it to that list (``worker/alias.py``, which loads nothing of this module until a
worker chooses the pool). The full class path works wherever Celery takes a pool class:
``worker_pool = "celery_fair.worker.pool:FairPool"``, or
``CELERY_CUSTOM_WORKER_POOL=celery_fair.worker.pool:FairPool celery worker -P custom``.

``FairPool`` itself is fair prefork. A ``worker_init`` handler replaces it, before Celery
instantiates anything, by the class that mixes the gate's hooks into the pool named by
``fair_pool``; Celery reads class attributes such as ``uses_semaphore`` before it builds the
pool, so the composition must be a real subclass, made up front.
"""

from __future__ import annotations

import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from celery import concurrency
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.utils.log import get_logger
from kombu.utils.compat import detect_environment

from ..errors import ConfigurationError
from .alias import ALIAS, CLASS_PATH, register

if TYPE_CHECKING:
    from .gate import Gate

__all__ = ["FairPool", "FairPoolMixin", "fair_pool_class", "on_worker_init", "register"]

logger = get_logger(__name__)

_INNER_ALIASES = {k: v for k, v in concurrency.ALIASES.items() if k not in ("custom", ALIAS)}


class FairPoolMixin:
    """The gate's hooks on a real pool: exact starts and finishes, and gate statistics.

    ``apply_async`` is the one method every path into any pool goes through (Celery captures
    it when it builds a task's request class), so it is where callbacks are wrapped.
    """

    fair_gate: Gate | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        app = kwargs.get("app")
        if app is not None:
            from .bootstep import STEPS

            app.steps["consumer"].update(STEPS)

    def apply_async(self, target: Any, args: Any = None, kwargs: Any = None, **options: Any) -> Any:
        gate = self.fair_gate
        if gate is not None:
            options = gate.wrap_callbacks(args, options)
        return super().apply_async(target, args, kwargs, **options)  # type: ignore[misc]

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()  # type: ignore[misc]
        gate = self.fair_gate
        if gate is not None:
            info.update(gate.pool_info())
        return info


class FairPool(FairPoolMixin, PreforkPool):
    """Fair prefork; replaced at ``worker_init`` by the pool that ``fair_pool`` names."""

    @staticmethod
    def on_worker_init(worker: Any) -> None:
        """Check the fair settings and compose the pool (``worker_init``, worker/alias.py)."""
        on_worker_init(worker)


@cache
def fair_pool_class(inner: type) -> type:
    """The fair version of pool class ``inner``: the gate's hooks mixed into it."""
    if issubclass(inner, FairPoolMixin):
        return inner
    return type(
        f"Fair{inner.__name__}",
        (FairPoolMixin, inner),
        # Celery and its test helpers recognise green and prefork pools by module name.
        {"__module__": inner.__module__, "__doc__": f"{inner.__doc__} With the fair gate."},
    )


def resolve_inner(name: str) -> type:
    """The pool class that ``fair_pool`` names (an alias such as ``threads`` or a class path)."""
    if name in (ALIAS, CLASS_PATH, "custom"):
        raise ConfigurationError(f"fair_pool: {name!r} would wrap the fair pool in itself")
    target = _INNER_ALIASES.get(name, name)
    try:
        cls = concurrency.get_implementation(target)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(f"fair_pool: cannot load pool {name!r}: {exc}") from None
    if not isinstance(cls, type):
        raise ConfigurationError(f"fair_pool: {name!r} is not a pool class")
    _check_green(name, cls)
    return cls


def _check_green(name: str, cls: type) -> None:
    """A green pool needs a process patched before Celery started: refuse one that is not."""
    if not getattr(cls, "is_green", False):
        return
    green = next((g for g in ("gevent", "eventlet") if cls.__module__.endswith(f".{g}")), None)
    if green is not None and detect_environment() != green:  # Kombu's check, as Celery's
        raise ConfigurationError(
            f"fair_pool: {name!r} is a green pool, but this process is not monkey-patched for "
            f"{green} (Celery patches only for -P {green} itself). Start the worker with "
            f"`python -m celery_fair_green {green} -A <app> worker -P fair ...`."
        )


def _is_fair_choice(pool_cls: object) -> bool:
    if isinstance(pool_cls, str):
        return pool_cls in (ALIAS, CLASS_PATH)
    return pool_cls is FairPool


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """Validate the fair settings and compose the pool, before the worker builds anything."""
    if sender is None or not _is_fair_choice(getattr(sender, "pool_cls", None)):
        return
    from ..connect import declared_types, open_store
    from ..metrics import prometheus
    from ..routing import consume_shards
    from ..settings import FairSettings

    try:
        settings = FairSettings.from_celery_conf(sender.app.conf)
        types = declared_types(sender.app, dict(settings.types))
        inner = resolve_inner(settings.pool)
        if settings.metrics_port is not None:
            prometheus()  # installed, or the worker stops here
        store = open_store(settings, sender.app)
    except ConfigurationError as exc:
        # Signal handlers' exceptions are only logged by Celery; a wrong setting must stop.
        print(f"celery-fair: invalid configuration: {exc}", file=sys.stderr)
        raise SystemExit(78) from None  # EX_CONFIG
    sender.fair_settings = settings
    sender.fair_types = types
    sender.fair_store = store
    sender.pool_cls = fair_pool_class(inner)
    # Lanes are given out by the shared store: a worker without one consumes none.
    lanes = settings.lanes if store is not None else 0
    sharded = consume_shards(sender.app, lanes)
    if sharded:
        logger.info(
            "celery-fair: consuming the %d fair shards and %d lanes of %s too.",
            settings.shards,
            lanes,
            ", ".join(sharded),
        )


register()  # a pool named by its class path is loaded without the package's registration
