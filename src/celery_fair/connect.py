"""Where an app becomes settings plus a store: the one place that opens the shared store.

The producer side (idempotent and tracked submits, job control, runtime policies, ``fair.slot``)
and the worker side (the pool at ``worker_init``, the gate's dead letters) both need an app's
settings and its store; both come here, so neither imports the other. ``settings_of`` and
``app_store`` read and open them once per app and process; the worker's pool opens its own at
startup with ``open_store``, checked before it consumes anything.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import quote

from celery.utils.log import get_logger

from .core import JobType, KeyPolicies
from .errors import ConfigurationError, StoreUnavailable
from .runtime_policies import RuntimePolicies
from .settings import FairSettings, merge_type
from .store.redis import RedisStore

__all__ = [
    "app_store",
    "declared_types",
    "key_policies",
    "open_store",
    "settings_of",
    "shared_store",
    "store_url",
    "tracked_store",
    "untrack",
]

logger = get_logger(__name__)


def store_url(settings: FairSettings, app: Any) -> str | None:
    """Where the shared state lives: ``fair_store_url``, else the broker's Redis, else nowhere.

    ``None`` means this worker keeps its state alone (``fair_store_url = "memory"``, or a
    broker that is not Redis and no store configured).
    """
    if settings.store_url == "memory":
        return None
    if settings.store_url is not None:
        return settings.store_url
    connection = app.connection_for_read()
    try:
        if connection.transport.driver_type != "redis":
            return None
        url: str = connection.as_uri(include_password=True)
        scheme = url.partition("://")[0]
        if scheme == "sentinel":
            return _sentinel_url(connection.alt or [url], connection.transport_options)
    finally:
        connection.release()
    return url if scheme in ("redis", "rediss") else None


def _sentinel_url(sentinels: list[str], options: Mapping[str, Any]) -> str:
    """The store's URL for a Sentinel broker: its Sentinels, and the master's name from
    ``broker_transport_options`` unless the URL already says it."""
    url = ";".join(sentinels)
    master = options.get("master_name")
    if "master_name=" in url or not master:
        return url  # without a name, RedisStore.from_url says what is missing
    return f"{url}{'&' if '?' in sentinels[-1] else '?'}master_name={quote(str(master))}"


def open_store(settings: FairSettings, app: Any) -> RedisStore | None:
    """The app's Redis store, checked (a worker opens it before it consumes anything).

    Raises:
        ConfigurationError: The store holds another schema version. An unreachable Redis is
            not an error here: the worker starts in the configured outage mode.
    """
    url = store_url(settings, app)
    if url is None:
        return None
    sentinel_kwargs = None
    if settings.store_url is None and url.startswith("sentinel://"):
        # Following a Sentinel broker: its Sentinels' own options (a password...) too.
        sentinel_kwargs = (app.conf.broker_transport_options or {}).get("sentinel_kwargs")
    store = RedisStore.from_url(
        url,
        sentinel_kwargs=sentinel_kwargs,
        prefix=settings.store_prefix,
        alpha=settings.alpha,
        lifecycle=settings.lifecycle,
        lease=settings.lease_seconds,
        dedupe=settings.dedupe_seconds,
        lane_seconds=settings.lane_seconds,
    )
    try:
        store.check()
    except StoreUnavailable as exc:
        logger.warning("celery-fair: the shared store is unreachable at startup (%s).", exc)
    return store


def settings_of(app: Any) -> Any:
    """The app's ``FairSettings``, read once per app (and process)."""
    known = _settings.get(app)
    if known is None:
        known = _settings[app] = FairSettings.from_celery_conf(app.conf)
    return known


_settings: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
# Each app's settings and the store its producers record submissions in, from its first
# keyed submit on.
_stores: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def app_store(app: Any) -> tuple[Any, Any]:
    """The app's settings and shared store, read and opened once per app (and process).

    Raises:
        ConfigurationError: The app has no shared store.
    """
    known = _stores.get(app)
    if known is None:
        settings = settings_of(app)
        store = open_store(settings, app)
        if store is None:
            raise ConfigurationError(
                "idempotency keys and tracked submissions need a shared store, for every "
                "producer to see the others' submissions: set fair_store_url to a Redis URL "
                "(or use a Redis broker)"
            )
        known = _stores[app] = (settings, store)
    return known


def shared_store(app: Any) -> Any | None:
    """The app's shared store (as ``app_store``), or ``None`` if it has none, or one that
    cannot be used (logged)."""
    try:
        return app_store(app)[1]
    except ConfigurationError as exc:
        if store_url(settings_of(app), app) is not None:
            logger.warning("celery-fair: the shared store cannot be used: %s", exc)
        return None


POLICIES_EVERY = 1.0
"""A producer reads the runtime policies again at most this often (seconds), as workers do."""

# Each app's key policies as a producer last read them: (read at, version, policies).
_policies: weakref.WeakKeyDictionary[Any, tuple[float, int, KeyPolicies]] = (
    weakref.WeakKeyDictionary()
)


def key_policies(app: Any) -> KeyPolicies:
    """The key policies in force as this producer knows them: ``fair_keys``, with the shared
    store's runtime policies on top, read again at most once per ``POLICIES_EVERY`` (one
    round trip, only when asked). Without a shared store, ``fair_keys`` alone; while it
    cannot be reached, what was last read."""
    now = time.monotonic()
    known = _policies.get(app)
    if known is not None and now - known[0] < POLICIES_EVERY:
        return known[2]
    configured: KeyPolicies = settings_of(app).keys
    store = shared_store(app)
    if store is None:
        _policies[app] = (now, 0, configured)
        return configured
    try:
        version, doc = store.policies()
    except StoreUnavailable as exc:
        logger.warning("celery-fair: runtime policies not read (fair_keys apply): %s", exc)
        policies = configured if known is None else known[2]
        _policies[app] = (now, 0 if known is None else known[1], policies)
        return policies
    if known is not None and known[1] == version:
        policies = known[2]
    else:
        policies = RuntimePolicies.from_json(doc).merged(configured)
    _policies[app] = (now, version, policies)
    return policies


def tracked_store(app: Any) -> Any:
    """The store the app's producers record submissions in (job control reads it)."""
    return app_store(app)[1]


def untrack(app: Any, task_ids: Collection[str]) -> None:
    """Forget ended submissions (the worker's end of a job, job control's cancel); a store
    that cannot be reached only leaves them to lapse after ``fair_track_seconds``."""
    try:
        _, store = app_store(app)
        store.untrack(task_ids)
    except (StoreUnavailable, ConfigurationError) as exc:
        logger.warning("celery-fair: could not forget ended submissions %s: %s", task_ids, exc)


def declared_types(app: Any, settings_types: dict[str, JobType]) -> dict[str, JobType]:
    """Every job type of ``app``: from ``fair_types`` and from its fair tasks, checked.

    A fair task is one whose class names a job type (``FairTask`` and its subclasses): read
    through that class's own methods, so this needs nothing of the producer side.

    Raises:
        ConfigurationError: A type is declared twice with different options, or a fair task
            names a type that nobody declares.
    """
    types = dict(settings_types)
    named: dict[str, str] = {}
    for name, task in sorted(app.tasks.items()):
        cls = type(task)
        if getattr(cls, "job_type_name", None) is None:
            continue
        jtype = cls.declared_job_type()
        if jtype is not None:
            merge_type(types, jtype, f"task {name!r}")
        named[name] = cls.job_type_name()
    for task_name, type_name in named.items():
        if type_name not in types:
            raise ConfigurationError(
                f"task {task_name!r} names job type {type_name!r}, which no task and no "
                "fair_types entry declares with a priority"
            )
    return types
