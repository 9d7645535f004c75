"""Runtime policies, the document: weights, minimums and caps by fairness key, and pauses of
keys and types, changed while the fleet runs.

They live in the shared store as one small JSON document with a version (``{prefix}:policies``);
every worker's heartbeat (at least once a second) sends the version it has and gets the
document back when it changed, so a change reaches the whole fleet within about a second, with
no extra round trip while nothing changes. A worker applies it on top of its configured
``fair_keys``: a runtime entry replaces the configured entry of the same name or pattern
(configured entries first, in their order, then runtime ones), and ``reset`` removes it, so
the configured policy applies again.

This module is the document and its rules, pure (the engine applies it with ``apply_to``;
it needs neither Celery nor a store). ``FleetPolicies(app)`` (policies.py) is the Python API
that changes it through an app's store; ``celery -A app fair weights|pause|resume``
(commands.py) the command line. ``entries`` lists every entry in force, configured and runtime,
and ``explain`` says which entry gives one key its policy and where each value comes from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .core import KeyPolicies, KeyPolicy
from .core.types import DEFAULT_KEY_POLICY, KEY_OPTIONS
from .errors import ConfigurationError

__all__ = ["RuntimePolicies", "apply_to", "describe", "entries", "explain"]


@dataclass(frozen=True)
class RuntimePolicies:
    """The document: key policies set at run time, paused keys, types and tenants.

    ``keys`` maps a name or pattern (as in ``fair_keys``) to the options given for it, each
    already checked by ``KeyPolicy``.
    """

    keys: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    paused_keys: frozenset[str] = frozenset()
    paused_types: frozenset[str] = frozenset()
    paused_tenants: frozenset[str] = frozenset()  # (two-level keys)

    @classmethod
    def from_json(cls, text: str) -> RuntimePolicies:
        """Parse a document (``""``: none). A document not written by this module (edited by
        hand in Redis, say) raises ``ConfigurationError`` saying what is wrong."""
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigurationError(f"runtime policies: not JSON ({exc})") from None
        if not isinstance(raw, dict):
            raise ConfigurationError("runtime policies: expected a JSON object")
        keys = raw.get("keys", {})
        if not isinstance(keys, dict):
            raise ConfigurationError("runtime policies: 'keys' must be an object")
        checked = {}
        for name, options in keys.items():
            checked[name] = _checked(name, options)
        return cls(
            checked,
            _names(raw.get("paused_keys", []), "paused_keys"),
            _names(raw.get("paused_types", []), "paused_types"),
            _names(raw.get("paused_tenants", []), "paused_tenants"),
        )

    def to_json(self) -> str:
        return json.dumps(describe(self), sort_keys=True)

    def merged(self, configured: KeyPolicies) -> KeyPolicies:
        """``configured`` with these runtime entries on top (replacing those of the same name
        or pattern)."""
        if not self.keys:
            return configured
        spec: dict[str, KeyPolicy] = dict(configured.exact)
        spec.update(dict(configured.patterns))
        if configured.default != KeyPolicies().default:
            spec["*"] = configured.default
        for name, options in self.keys.items():
            spec[name] = KeyPolicy(**options)
        return KeyPolicies.from_mapping(spec)

    def with_key(self, name: str, **options: Any) -> RuntimePolicies:
        """Set ``name``'s runtime policy: the options given replace those set before; an
        option given as ``None`` is removed (``max_concurrency=None``: no cap)."""
        current = dict(self.keys.get(name, {}))
        for option, value in options.items():
            if option not in KEY_OPTIONS:
                raise ConfigurationError(
                    f"key policy {name!r}: unknown option {option!r}; expected {KEY_OPTIONS}"
                )
            if value is None:
                current.pop(option, None)
            else:
                current[option] = value
        keys = dict(self.keys)
        keys[name] = _checked(name, current)
        return replace(self, keys=keys)

    def without_key(self, name: str) -> RuntimePolicies:
        return replace(self, keys={k: v for k, v in self.keys.items() if k != name})

    def paused(self, kind: str, name: str, paused: bool) -> RuntimePolicies:
        """With key, type or tenant (``kind``) ``name`` paused or resumed."""
        if kind not in ("key", "type", "tenant"):
            raise ConfigurationError(f"pause a 'key', a 'type' or a 'tenant', not {kind!r}")
        field_name = f"paused_{kind}s"
        names = set(getattr(self, field_name))
        (names.add if paused else names.discard)(name)
        changed: dict[str, Any] = {field_name: frozenset(names)}
        return replace(self, **changed)


def _checked(name: object, options: object) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"runtime policies: a key name or pattern is a string: {name!r}")
    if not isinstance(options, dict):
        raise ConfigurationError(f"runtime policies: {name!r} must map options to values")
    unknown = set(options) - set(KEY_OPTIONS)
    if unknown:
        raise ConfigurationError(f"key policy {name!r}: unknown option(s) {sorted(unknown)}")
    try:
        KeyPolicy(**options)
    except ConfigurationError as exc:
        raise ConfigurationError(f"key policy {name!r}: {exc}") from None
    return dict(options)


def _names(value: object, what: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigurationError(f"runtime policies: {what!r} must be a list of names")
    return frozenset(value)


def apply_to(core: Any, configured: KeyPolicies, runtime: RuntimePolicies) -> None:
    """Make ``core`` follow ``runtime`` on top of ``configured``: its key policies, and which
    keys, tenants and types are paused (types it does not know are left alone)."""
    core.set_key_policies(runtime.merged(configured))
    keys, types = core.paused
    for name in runtime.paused_keys - keys:
        core.pause_key(name)
    for name in keys - runtime.paused_keys:
        core.resume_key(name)
    tenants = core.paused_tenants
    for name in runtime.paused_tenants - tenants:
        core.pause_tenant(name)
    for name in tenants - runtime.paused_tenants:
        core.resume_tenant(name)
    known = set(core.types)
    for name in (runtime.paused_types - types) & known:
        core.pause_type(name)
    for name in (types - runtime.paused_types) & known:
        core.resume_type(name)


def describe(runtime: RuntimePolicies) -> dict[str, Iterable[Any]]:
    """For ``fair weights`` and ``inspect``: plain data."""
    return {
        "keys": {name: dict(options) for name, options in runtime.keys.items()},
        "paused_keys": sorted(runtime.paused_keys),
        "paused_types": sorted(runtime.paused_types),
        "paused_tenants": sorted(runtime.paused_tenants),
    }


def _given(policy: KeyPolicy) -> dict[str, Any]:
    """The options of a configured entry that differ from the default policy."""
    return {
        option: getattr(policy, option)
        for option in KEY_OPTIONS
        if getattr(policy, option) != getattr(DEFAULT_KEY_POLICY, option)
    }


def entries(configured: KeyPolicies, runtime: RuntimePolicies) -> list[dict[str, Any]]:
    """Every key policy entry in force, in the order a key is matched against them (exact
    names, then patterns, then ``"*"``, the default): its ``name``, the ``options`` it sets,
    ``from`` (``fair_keys``, ``runtime`` or ``default``) and, for a runtime entry that replaces
    a ``fair_keys`` one, the options it ``replaces``.

    Example:
        >>> configured = KeyPolicies.from_mapping({"ops": {"min_slots": 2}})
        >>> [(e["name"], e["options"], e["from"]) for e in entries(configured, RuntimePolicies())]
        [('ops', {'min_slots': 2}, 'fair_keys'), ('*', {}, 'default')]
    """
    merged = runtime.merged(configured)
    names = [*merged.exact, *(pattern for pattern, _ in merged.patterns), "*"]
    out = []
    for name in names:
        mine = configured.entry(name)
        if name in runtime.keys:
            entry: dict[str, Any] = {
                "name": name,
                "options": dict(runtime.keys[name]),
                "from": "runtime",
                "replaces": None if mine is None else _given(mine),
            }
        elif mine is not None:
            entry = {"name": name, "options": _given(mine), "from": "fair_keys", "replaces": None}
        else:  # "*" neither configured nor set: every key without an entry
            entry = {"name": name, "options": {}, "from": "default", "replaces": None}
        out.append(entry)
    return out


def explain(configured: KeyPolicies, runtime: RuntimePolicies, key: str) -> dict[str, Any]:
    """Which entry gives fairness key ``key`` its policy, the policy, and where each value
    comes from: the entry (``fair_keys`` or ``runtime``) when it sets the value, else
    ``default``. A runtime entry replaces the ``fair_keys`` entry of its name whole: a value
    it does not set is the default, not the configured one (``replaces`` says what was).

    Example:
        >>> configured = KeyPolicies.from_mapping({"tenant:*": {"max_concurrency": 4}})
        >>> found = explain(configured, RuntimePolicies(), "tenant:acme")
        >>> found["entry"], found["policy"]["max_concurrency"], found["sources"]["weight"]
        ('tenant:*', 4, 'default')
    """
    name, policy = runtime.merged(configured).match(key)
    [entry] = [e for e in entries(configured, runtime) if e["name"] == name]
    return {
        "key": key,
        "entry": name,
        "from": entry["from"],
        "replaces": entry["replaces"],
        "policy": {option: getattr(policy, option) for option in KEY_OPTIONS},
        "sources": {
            option: entry["from"] if option in entry["options"] else "default"
            for option in KEY_OPTIONS
        },
        "paused": key in runtime.paused_keys,
    }
