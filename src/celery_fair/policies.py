"""Changing the runtime policies while the fleet runs (weights, minimums and caps by fairness
key, pauses of keys and types), through the shared store; the document itself and how a
worker applies it on top of ``fair_keys`` are in ``runtime_policies.py``.

``FleetPolicies(app)`` is the Python API; ``celery -A app fair weights|pause|resume``
(commands.py) the command line. ``entries`` lists every entry in force, configured and runtime,
and ``explain`` says which entry gives one key its policy and where each value comes from.
Both need a shared Redis store: a worker alone has nothing to share a change through.

The document and its rules (``RuntimePolicies``, ``apply_to``, ``entries``, ``explain``) are in
``runtime_policies.py``, below the engine that applies them; they are named here too.
"""

from __future__ import annotations

from typing import Any

from .connect import open_store
from .core import KeyPolicies
from .errors import ConfigurationError
from .runtime_policies import RuntimePolicies, apply_to, describe, entries, explain
from .settings import FairSettings

__all__ = ["FleetPolicies", "RuntimePolicies", "apply_to", "describe", "entries", "explain"]


class FleetPolicies:
    """Change a fleet's policies while it runs, through its shared store.

    Example:
        >>> p = FleetPolicies(app)                                   # doctest: +SKIP
        >>> p.set("tenant:acme", weight=3, max_concurrency=10)       # doctest: +SKIP
        >>> p.pause_key("tenant:spam"); p.resume_key("tenant:spam")  # doctest: +SKIP
        >>> p.reset("tenant:acme")        # its configured policy again  # doctest: +SKIP

    Raises:
        ConfigurationError: The app has no shared store (a Redis ``fair_store_url``, or a Redis
            broker), or an option is invalid.
    """

    def __init__(self, app: Any = None, *, store: Any = None) -> None:
        if store is None:
            store = _store_of(app)
        self.store = store
        self.app = app

    def show(self) -> tuple[int, RuntimePolicies]:
        """The version and the runtime policies now."""
        version, doc = self.store.policies()
        return version, RuntimePolicies.from_json(doc)

    def explain(self, key: str) -> dict[str, Any]:
        """Key ``key``'s policy in force now, the entry it comes from and where each value
        comes from (``explain``), with the app's ``fair_keys`` under the runtime entries."""
        _, runtime = self.show()
        return explain(self.configured(), runtime, key)

    def separator(self) -> str | None:
        """The app's ``fair_key_separator`` (``None``: flat keys, or no app)."""
        if self.app is None:
            return None
        return FairSettings.from_celery_conf(self.app.conf).key_separator

    def configured(self) -> KeyPolicies:
        """The app's ``fair_keys`` (none without an app)."""
        if self.app is None:
            return KeyPolicies()
        return FairSettings.from_celery_conf(self.app.conf).keys

    def set(self, name: str, **options: Any) -> RuntimePolicies:
        """Set key (or pattern) ``name``'s weight, min_slots and max_concurrency."""
        RuntimePolicies().with_key(name, **options)  # refuse bad options before writing
        return self._change(lambda p: p.with_key(name, **options))

    def reset(self, name: str) -> RuntimePolicies:
        """Drop ``name``'s runtime policy: the configured one applies again."""
        return self._change(lambda p: p.without_key(name))

    def pause_key(self, name: str) -> RuntimePolicies:
        """Start nothing more of fairness key ``name``, fleet-wide, until ``resume_key``: its
        jobs stay held or in the broker, and their aging stands still."""
        return self._change(lambda p: p.paused("key", name, True))

    def resume_key(self, name: str) -> RuntimePolicies:
        return self._change(lambda p: p.paused("key", name, False))

    def pause_tenant(self, name: str) -> RuntimePolicies:
        """With two-level keys (``fair_key_separator``), start nothing more of any of tenant
        ``name``'s keys, fleet-wide, until ``resume_tenant``: as ``pause_key`` for each."""
        return self._change(lambda p: p.paused("tenant", name, True))

    def resume_tenant(self, name: str) -> RuntimePolicies:
        return self._change(lambda p: p.paused("tenant", name, False))

    def pause_type(self, name: str) -> RuntimePolicies:
        """Start no more jobs of job type ``name``, fleet-wide, until ``resume_type``."""
        return self._change(lambda p: p.paused("type", name, True))

    def resume_type(self, name: str) -> RuntimePolicies:
        return self._change(lambda p: p.paused("type", name, False))

    def _change(self, change: Any) -> RuntimePolicies:
        out: list[RuntimePolicies] = []

        def apply(doc: str) -> tuple[str, frozenset[str], frozenset[str], frozenset[str]]:
            new = change(RuntimePolicies.from_json(doc))
            out[:] = [new]
            return new.to_json(), new.paused_keys, new.paused_types, new.paused_tenants

        self.store.update_policies(apply)
        return out[0]

    def close(self) -> None:
        self.store.close()


def _store_of(app: Any) -> Any:
    if app is None:
        raise ConfigurationError("FleetPolicies needs the Celery app (or a store)")
    store = open_store(FairSettings.from_celery_conf(app.conf), app)
    if store is None:
        raise ConfigurationError(
            "runtime policies need a shared store: set fair_store_url to a Redis URL (or use a "
            "Redis broker); a worker alone has nothing to share a change through"
        )
    return store
