"""Values of the scheduling core: configuration in, decisions and snapshots out."""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from types import MappingProxyType
from typing import NamedTuple, NewType

from ..errors import ConfigurationError, SchedulerError
from .rates import valid_terms

__all__ = [
    "BLOCK_ORDER",
    "KEY_OPTIONS",
    "PRIORITY_SCOPES",
    "TYPE_OPTIONS",
    "Admission",
    "Aging",
    "BlockReason",
    "CancelOutcome",
    "CostLifecycle",
    "ExpectedStart",
    "FairnessKey",
    "JobId",
    "JobRef",
    "JobState",
    "JobType",
    "JobUid",
    "JobView",
    "KeyPolicies",
    "KeyPolicy",
    "Release",
    "SchedulerConfig",
    "Snapshot",
    "TypeName",
    "check_separator",
    "key_label",
    "lower_bound",
    "tier_cap",
]

TypeName = NewType("TypeName", str)
"""The name of a registered job type (``"sync-clone"``)."""

JobId = NewType("JobId", str)
"""The resource a job works on (``"github.com/torvalds/linux"``); ``None`` when it names none."""

FairnessKey = NewType("FairnessKey", str)
"""Who asked for a job; the empty string is background work."""


def key_label(key: str) -> str:
    """How every tool shows fairness key ``key``: the background key ``""`` as
    ``(background)``, any other as it is."""
    return key if key else "(background)"


JobUid = Hashable
"""A job's identity (docs/concepts.md: its task id, retry and replacement, as ``1f0c/retry-2``;
the gate and the store know it by that string). The core takes any hashable the caller keeps
unique among the jobs it holds."""

JobRef = JobUid
"""The old name of ``JobUid``, kept for one release."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(
        value
    )


@dataclass(frozen=True, slots=True)
class Aging:
    """How a waiting job's effective priority rises (seed 001's priority aging).

    Once a job has waited longer than ``grace`` (not counting time its key or type was
    paused), its effective priority is ``base + floor((wait - grace) / interval)``, never above
    ``max_effective_priority``. It is computed when a decision looks, never stored; the job's
    own priority, and the tier whose cap it counts against, never change.

    Args:
        interval: Seconds of waiting per level, > 0.
        grace: Seconds a job waits before it starts to rise, >= 0.
        max_effective_priority: The ceiling; ``None`` for none. A type whose priority is at
            or above it does not age.
        urgent_threshold: A job that has *aged* to this effective priority (or above) is
            urgent: it goes before every job that is not, oldest first, and its key's cap and
            other keys' minimums no longer hold it back (type and tier caps, conflicts,
            pauses and capacity still do). This is what bounds the wait of every job; see
            docs/design.md, "The starvation bound". ``None``: no job is ever urgent.

    Example:
        >>> a = Aging(interval=60, grace=300, max_effective_priority=9, urgent_threshold=9)
        >>> a.effective(base=1, wait=300), a.effective(base=1, wait=420), a.effective(1, 9e9)
        (1, 3, 9)
    """

    interval: float
    grace: float = 0.0
    max_effective_priority: int | None = None
    urgent_threshold: int | None = None

    def __post_init__(self) -> None:
        if not _is_number(self.interval) or self.interval <= 0:
            raise ConfigurationError(
                f"aging interval must be a positive number, got {self.interval!r}"
            )
        if not _is_number(self.grace) or self.grace < 0:
            raise ConfigurationError(f"aging grace must be a number >= 0, got {self.grace!r}")
        for name in ("max_effective_priority", "urgent_threshold"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise ConfigurationError(
                    f"aging {name} must be a positive int or None, got {value!r}"
                )
        object.__setattr__(self, "interval", float(self.interval))
        object.__setattr__(self, "grace", float(self.grace))

    def effective(self, base: int, wait: float) -> int:
        """The effective priority of a job of priority ``base`` that has waited ``wait``."""
        if wait <= self.grace:
            return base
        steps = math.floor((wait - self.grace) / self.interval)
        ceiling = self.max_effective_priority
        if ceiling is None:
            return base + steps
        return max(base, min(base + steps, ceiling))

    def is_urgent(self, base: int, effective: int) -> bool:
        """Whether a job of priority ``base`` at ``effective`` has aged into urgency."""
        threshold = self.urgent_threshold
        return threshold is not None and effective > base and effective >= threshold

    def ages(self, base: int) -> bool:
        """Whether a job of priority ``base`` can rise at all."""
        ceiling = self.max_effective_priority
        return ceiling is None or ceiling > base

    @classmethod
    def from_mapping(cls, spec: Mapping[str, object] | Aging) -> Aging:
        """From ``{"interval": .., "grace": .., "max_effective_priority": ..,
        "urgent_threshold": ..}`` (``ceiling`` and ``urgent`` are accepted as short names)."""
        if isinstance(spec, Aging):
            return spec
        if not isinstance(spec, Mapping):
            raise ConfigurationError(f"aging must be a mapping, got {spec!r}")
        names = {"ceiling": "max_effective_priority", "urgent": "urgent_threshold"}
        options = {names.get(k, k): v for k, v in spec.items()}
        unknown = set(options) - {
            "interval",
            "grace",
            "max_effective_priority",
            "urgent_threshold",
        }
        if unknown:
            raise ConfigurationError(
                f"aging: unknown option(s) {sorted(unknown)}; expected interval, grace, "
                "max_effective_priority, urgent_threshold"
            )
        if "interval" not in options:
            raise ConfigurationError("aging: interval is required")
        return cls(**options)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class JobType:
    """A registered kind of job and the limits that apply to it.

    Args:
        name: The type's name; jobs name their type by it.
        priority: A positive int. Higher tiers are dispatched first, and unless the scheduler
            configures ``tier_caps`` for it, the value is also the number of jobs of this tier
            that may run at once (the seed's double duty).
        max_concurrency: Jobs of this type that may run at once; ``None`` for no limit.
        conflict_group: Jobs whose types share a non-empty group and that carry the same
            ``job_id`` never run at the same time.
        default_cost: The estimate used for a ``(type, job_id)`` before any observation.
        aging: How this type's waiting jobs rise in priority; ``None`` follows the
            scheduler's ``aging``.
        rate: How fast jobs of this type may start, all keys together (fleet-wide with a
            shared store), as a key's ``rate`` (``"10/s"``, ``"600/m"``, a number per second);
            ``None`` for no limit. A type that used its bucket up starts nothing until it
            refills, as while paused; other types' jobs take the slots (core/rates.py).
        burst: How much the type's bucket holds (a number >= 1; default 1).
        per: What a start charges the bucket: ``"job"`` (1) or ``"cost"`` (its estimate).

    Example:
        >>> repack = JobType("repack", priority=10, max_concurrency=3, conflict_group="git")
        >>> repack.default_cost
        1.0
        >>> JobType("export", priority=2, rate="120/m", burst=5).rate
        2.0
    """

    name: str
    priority: int
    max_concurrency: int | None = None
    conflict_group: str = ""
    default_cost: float = 1.0
    aging: Aging | None = None
    rate: float | None = None
    burst: float | None = None
    per: str = "job"

    def __post_init__(self) -> None:
        where = f"job type {self.name!r}"
        if self.aging is not None and not isinstance(self.aging, Aging):
            raise ConfigurationError(f"{where}: aging must be an Aging or None, got {self.aging!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"job type name must be a non-empty string, got {self.name!r}")
        if not _is_int(self.priority) or self.priority < 1:
            raise ConfigurationError(
                f"{where}: priority must be a positive int, got {self.priority!r}"
            )
        if self.max_concurrency is not None and (
            not _is_int(self.max_concurrency) or self.max_concurrency < 0
        ):
            raise ConfigurationError(
                f"{where}: max_concurrency must be an int >= 0 or None, "
                f"got {self.max_concurrency!r}"
            )
        if not isinstance(self.conflict_group, str):
            raise ConfigurationError(
                f"{where}: conflict_group must be a string, got {self.conflict_group!r}"
            )
        if not _is_number(self.default_cost) or self.default_cost < 0:
            raise ConfigurationError(
                f"{where}: default_cost must be a finite number >= 0, got {self.default_cost!r}"
            )
        object.__setattr__(self, "default_cost", float(self.default_cost))
        try:
            rate, burst = valid_terms(self.rate, self.burst, self.per)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "burst", burst)

    @property
    def bucket(self) -> float:
        """What the type's bucket holds when full (``burst``, default 1)."""
        return 1.0 if self.burst is None else self.burst


TYPE_OPTIONS = (
    "priority",
    "max_concurrency",
    "conflict_group",
    "default_cost",
    "aging",
    "rate",
    "burst",
    "per",
)
"""A job type's options, as ``JobType``'s fields after its name: what ``fair_types`` entries,
``@fair_task`` and simulator traces take."""


@dataclass(frozen=True, slots=True)
class CostLifecycle:
    """How accumulated costs and learned estimates are forgotten.

    Args:
        cost_ttl: Seconds after which an idle fairness key's accumulated cost is evicted
            (it then starts again from zero, or from the minimum if ``advance_idle``).
            ``None`` keeps it forever. A key is idle when it has no pending and no running job.
        estimate_ttl: Seconds after which an estimate not used or updated is evicted (the
            type's ``default_cost`` applies again). ``None`` keeps it forever.
        reset_interval: If set, every accumulated cost is set to zero each time this many
            seconds pass (counted from the scheduler's creation).
        advance_idle: When a key becomes active (its first pending job while it has none
            pending or running), raise its accumulated cost to the minimum accumulated cost of
            the keys that are active, so neither a returning nor a brand-new key can jump ahead
            of everyone on an old or fresh counter.
    """

    cost_ttl: float | None = 3600.0
    estimate_ttl: float | None = 7 * 24 * 3600.0
    reset_interval: float | None = None
    advance_idle: bool = False

    def __post_init__(self) -> None:
        for name in ("cost_ttl", "estimate_ttl", "reset_interval"):
            value = getattr(self, name)
            if value is not None and (not _is_number(value) or value <= 0):
                raise ConfigurationError(f"{name} must be a positive number or None, got {value!r}")
        if not isinstance(self.advance_idle, bool):
            raise ConfigurationError(f"advance_idle must be a bool, got {self.advance_idle!r}")

    @classmethod
    def never(cls) -> CostLifecycle:
        """Keep every cost and estimate forever (the simulator's default)."""
        return cls(cost_ttl=None, estimate_ttl=None, reset_interval=None, advance_idle=False)


@dataclass(frozen=True, slots=True)
class KeyPolicy:
    """What one fairness key is entitled to.

    Args:
        weight: The key's share against other keys with work in the same rank: an admission
            charges the key ``estimate / weight``, so with backlog on both, a key of weight 3
            gets three times the slot-time of a key of weight 1. A positive number.
        min_slots: While the key runs fewer jobs than this (fleet-wide with a shared store),
            its jobs go before those of keys at or above their minimum, within their tier. Not
            a reservation: no slot waits idle for it. An int >= 0.
        max_concurrency: Jobs of this key that may run at once (fleet-wide with a shared
            store); ``None`` for no limit. A key at its cap is a blocker: its queued jobs wait
            and cost no decision anything until one of its jobs ends.
        max_priority: The highest priority the key's jobs may have: a job asked above it
            (by its producer, or by its type) gets it instead, and aging raises it no higher
            (urgency still applies: docs/design.md 5g). ``None`` for no bound. A positive int.
        rate: How fast the key may start jobs (fleet-wide with a shared store): ``"10/s"``,
            ``"600/m"``, ``"5000/h"``, or a number per second (kept as one); ``None`` for no
            limit. A key that used its bucket up is a blocker until it refills (core/rates.py).
        burst: How much the key's bucket holds: starts it may make at once after a quiet
            spell (or seconds of cost, with ``per = "cost"``). A number >= 1; default 1.
        per: What a start charges the bucket: ``"job"`` (1) or ``"cost"`` (the job's
            learned estimate, so expensive jobs use the rate up sooner).

    Example:
        >>> KeyPolicy(weight=3).weight
        3
        >>> KeyPolicy(rate="600/m", burst=5).rate
        10.0
    """

    weight: float = 1.0
    min_slots: int = 0
    max_concurrency: int | None = None
    max_priority: int | None = None
    rate: float | None = None
    burst: float | None = None
    per: str = "job"

    def __post_init__(self) -> None:
        if not _is_number(self.weight) or self.weight <= 0:
            raise ConfigurationError(f"weight must be a positive number, got {self.weight!r}")
        if not _is_int(self.min_slots) or self.min_slots < 0:
            raise ConfigurationError(f"min_slots must be an int >= 0, got {self.min_slots!r}")
        cap = self.max_concurrency
        if cap is not None and (not _is_int(cap) or cap < 0):
            raise ConfigurationError(f"max_concurrency must be an int >= 0 or None, got {cap!r}")
        bound = self.max_priority
        if bound is not None and (not _is_int(bound) or bound < 1):
            raise ConfigurationError(f"max_priority must be an int >= 1 or None, got {bound!r}")
        rate, burst = valid_terms(self.rate, self.burst, self.per)
        object.__setattr__(self, "rate", rate)
        object.__setattr__(self, "burst", burst)

    @property
    def bucket(self) -> float:
        """What the key's bucket holds when full (``burst``, default 1)."""
        return 1.0 if self.burst is None else self.burst


KEY_OPTIONS = ("weight", "min_slots", "max_concurrency", "max_priority", "rate", "burst", "per")
"""The options of a key's policy (``KeyPolicy``'s fields), as ``fair_keys`` and the runtime
policies name them."""


DEFAULT_KEY_POLICY = KeyPolicy()


@dataclass(frozen=True, slots=True)
class KeyPolicies:
    """Policies by fairness key: exact names first, then glob patterns (``tenant:*``, as
    ``fnmatch`` without case folding) in the order given, then ``default``.

    Example:
        >>> p = KeyPolicies.from_mapping({"tenant:*": {"weight": 2}, "ci": {"weight": 0.5}})
        >>> p.for_key("tenant:acme").weight, p.for_key("ci").weight, p.for_key("bob").weight
        (2, 0.5, 1.0)
    """

    exact: Mapping[str, KeyPolicy] = field(default_factory=dict)
    patterns: tuple[tuple[str, KeyPolicy], ...] = ()
    default: KeyPolicy = DEFAULT_KEY_POLICY

    def __post_init__(self) -> None:
        for name, policy in dict(self.exact).items():
            if not isinstance(name, str) or not isinstance(policy, KeyPolicy):
                raise ConfigurationError(f"key policy {name!r}: expected str -> KeyPolicy")
        for entry in self.patterns:
            if (
                not isinstance(entry, tuple)
                or len(entry) != 2
                or not isinstance(entry[0], str)
                or not isinstance(entry[1], KeyPolicy)
            ):
                raise ConfigurationError(f"key pattern {entry!r}: expected (str, KeyPolicy)")
        if not isinstance(self.default, KeyPolicy):
            raise ConfigurationError(f"default key policy must be a KeyPolicy: {self.default!r}")
        object.__setattr__(self, "exact", MappingProxyType(dict(self.exact)))
        object.__setattr__(self, "patterns", tuple(self.patterns))

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Mapping[str, object] | KeyPolicy]) -> KeyPolicies:
        """From ``{name or pattern: {"weight": .., "min_slots": .., "max_concurrency": ..,
        "max_priority": ..}}``.
        A name with ``*``, ``?`` or ``[`` is a pattern; ``"*"`` alone is the default."""
        exact: dict[str, KeyPolicy] = {}
        patterns: list[tuple[str, KeyPolicy]] = []
        default = DEFAULT_KEY_POLICY
        for name, value in dict(spec).items():
            if isinstance(value, KeyPolicy):
                policy = value
            elif isinstance(value, Mapping):
                unknown = set(value) - set(KEY_OPTIONS)
                if unknown:
                    raise ConfigurationError(
                        f"key policy {name!r}: unknown option(s) {sorted(unknown)}; "
                        f"expected {', '.join(KEY_OPTIONS)}"
                    )
                try:
                    policy = KeyPolicy(**value)  # type: ignore[arg-type]
                except ConfigurationError as exc:
                    raise ConfigurationError(f"key policy {name!r}: {exc}") from None
            else:
                raise ConfigurationError(f"key policy {name!r} must be a mapping, got {value!r}")
            if name == "*":
                default = policy
            elif isinstance(name, str) and any(c in name for c in "*?["):
                patterns.append((name, policy))
            else:
                exact[name] = policy
        return cls(exact, tuple(patterns), default)

    @property
    def rated(self) -> bool:
        """Whether some entry sets a rate (``KeyPolicy.rate``)."""
        entries = (*self.exact.values(), *(p for _, p in self.patterns), self.default)
        return any(policy.rate is not None for policy in entries)

    def levels(self, separator: str) -> tuple[KeyPolicies, KeyPolicies]:
        """The policies of tenants and of keys with two-level keys (``separator``): the
        entries whose name or pattern holds no separator are the tenants' (``"acme"``,
        ``"*"``: every tenant), those that hold it the keys' (``"acme/*"``, ``"*/*"``). A key
        has a policy of its own only if its name holds the separator (``key_policy``).

        Example:
            >>> p = KeyPolicies.from_mapping({"acme": {"weight": 2}, "acme/*": {"weight": 3}})
            >>> tenants, keys = p.levels("/")
            >>> tenants.for_key("acme").weight, keys.for_key("acme/alice").weight
            (2, 3)
        """
        tenants = KeyPolicies(
            {n: p for n, p in self.exact.items() if separator not in n},
            tuple((n, p) for n, p in self.patterns if separator not in n),
            self.default,
        )
        keys = KeyPolicies(
            {n: p for n, p in self.exact.items() if separator in n},
            tuple((n, p) for n, p in self.patterns if separator in n),
        )
        return tenants, keys

    def bound(self, name: str, separator: str | None = None) -> int | None:
        """Key ``name``'s ``max_priority`` (``None``: none): its policy's, or with two-level
        keys (``separator``) the lower of its own and its tenant's (``levels``).

        Example:
            >>> p = KeyPolicies.from_mapping({"acme": {"max_priority": 4}})
            >>> p.bound("acme/alice"), p.bound("acme/alice", "/")
            (None, 4)
        """
        if separator is None:
            return self.for_key(name).max_priority
        tenants, keys = self.levels(separator)
        head, sep, _ = name.partition(separator)
        own = keys.for_key(name).max_priority if sep else None
        return lower_bound(own, tenants.for_key(head).max_priority)

    def for_key(self, name: str) -> KeyPolicy:
        """The policy of key ``name``. O(1) for an exact name, O(patterns) otherwise."""
        return self.match(name)[1]

    def match(self, name: str) -> tuple[str, KeyPolicy]:
        """The entry that gives key ``name`` its policy: its own name, the first pattern that
        matches it, or ``"*"`` (the default), with that policy.

        Example:
            >>> policies = KeyPolicies.from_mapping({"tenant:*": {"weight": 2}})
            >>> name, policy = policies.match("tenant:a")
            >>> name, policy.weight
            ('tenant:*', 2)
        """
        policy = self.exact.get(name)
        if policy is not None:
            return name, policy
        for pattern, policy in self.patterns:
            if fnmatchcase(name, pattern):
                return pattern, policy
        return "*", self.default

    def entry(self, name: str) -> KeyPolicy | None:
        """The policy of the entry (a name, a pattern, or ``"*"``) ``name``, if there is one:
        ``"*"`` is an entry only when it differs from the default policy."""
        if name == "*":
            return None if self.default == DEFAULT_KEY_POLICY else self.default
        return self.exact.get(name) or dict(self.patterns).get(name)

    @property
    def trivial(self) -> bool:
        """Every key has the default policy: weight 1, no minimum and no cap."""
        return not self.exact and not self.patterns and self.default == DEFAULT_KEY_POLICY


PRIORITY_SCOPES = ("global", "key")
"""What a job's priority may order (``SchedulerConfig.priority_scope``)."""


def lower_bound(a: int | None, b: int | None) -> int | None:
    """The lower of two ``max_priority`` bounds, ``None`` being none."""
    if a is None:
        return b
    return a if b is None else min(a, b)


_NOT_SEPARATORS = "*?[]"


def check_separator(separator: object) -> None:
    """Refuse a ``key_separator`` that is not ``None`` or one character outside ``*?[]``
    (which patterns in ``fair_keys`` use).

    Raises:
        ConfigurationError: It is not.
    """
    if separator is None:
        return
    if not isinstance(separator, str) or len(separator) != 1 or separator in _NOT_SEPARATORS:
        raise ConfigurationError(
            f"key_separator must be None or one character other than {_NOT_SEPARATORS}, "
            f"got {separator!r}"
        )


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Scheduler-wide settings.

    Args:
        capacity: Global slots: jobs that may run at once, whatever their type.
        tier_caps: Per-priority override of the tier cap (``None`` = no tier cap). A tier
            not listed is capped at its own priority value.
        alpha: Smoothing factor of the estimate's moving average, ``0 < alpha <= 1``.
        lifecycle: How accumulated costs and estimates are forgotten.
        keys: Weights and caps by fairness key (none by default: every key weighs 1).
        aging: How waiting jobs rise in priority, for every type that does not set its own;
            ``None`` (the default): they do not.
        allocation_caps: Make each key's slot allocation (``Scheduler.allocation``) its soft
            cap: within a tier, a key running fewer jobs than its allocation goes before the
            keys running their allocation or more, which take a slot only when no key below
            its allocation can. Nothing idles for it (work-conserving). Off by default. With
            ``key_separator``, tenants get their allocation of the slots first and each
            tenant's keys their allocation of its slots (``allocation.two_levels``).
        priority_scope: What a priority orders. ``"global"`` (the default): every job of a
            higher (effective) priority goes before every job of a lower one, and fairness
            orders keys within a priority. ``"key"``: the key to serve is chosen by fairness
            first (minimum slots, then weighted accumulated cost), and priority orders only
            that key's own jobs. Urgent jobs go first in both; caps and conflicts hold in
            both (docs/design.md 5g says when to choose which).
        key_separator: Two-level keys (``None``, the default: flat keys). With ``"/"``, key
            ``acme/alice`` belongs to tenant ``acme`` (the text before the first separator; a
            key without one is a tenant of one key, itself): tenants are served fairly first,
            then the keys within the chosen tenant, so a tenant that spreads its work over
            many keys gets one tenant's share. Policies named without the separator are the
            tenants' (``"acme"``, ``"*"``), those with it the keys' (``"acme/*"``, ``"*/*"``);
            see ``KeyPolicies.levels``. One character, not one of ``*?[]``.
    """

    capacity: int
    tier_caps: Mapping[int, int | None] = field(default_factory=dict)
    alpha: float = 0.3
    lifecycle: CostLifecycle = field(default_factory=CostLifecycle)
    keys: KeyPolicies = field(default_factory=KeyPolicies)
    aging: Aging | None = None
    allocation_caps: bool = False
    priority_scope: str = "global"
    key_separator: str | None = None

    def __post_init__(self) -> None:
        check_separator(self.key_separator)
        if self.priority_scope not in PRIORITY_SCOPES:
            raise ConfigurationError(
                f"priority_scope must be one of {', '.join(map(repr, PRIORITY_SCOPES))}, "
                f"got {self.priority_scope!r}"
            )
        if not isinstance(self.allocation_caps, bool):
            raise ConfigurationError(
                f"allocation_caps must be True or False, got {self.allocation_caps!r}"
            )
        if self.aging is not None and not isinstance(self.aging, Aging):
            raise ConfigurationError(f"aging must be an Aging or None, got {self.aging!r}")
        if not _is_int(self.capacity) or self.capacity < 0:
            raise ConfigurationError(f"capacity must be an int >= 0, got {self.capacity!r}")
        if not _is_number(self.alpha) or not 0 < self.alpha <= 1:
            raise ConfigurationError(f"alpha must be a number in (0, 1], got {self.alpha!r}")
        caps: dict[int, int | None] = {}
        for tier, cap in dict(self.tier_caps).items():
            if not _is_int(tier) or tier < 1:
                raise ConfigurationError(f"tier_caps: tier must be a positive int, got {tier!r}")
            if cap is not None and (not _is_int(cap) or cap < 0):
                raise ConfigurationError(
                    f"tier_caps[{tier}] must be an int >= 0 or None, got {cap!r}"
                )
            caps[tier] = cap
        object.__setattr__(self, "tier_caps", MappingProxyType(caps))
        if not isinstance(self.lifecycle, CostLifecycle):
            raise ConfigurationError(f"lifecycle must be a CostLifecycle, got {self.lifecycle!r}")
        if not isinstance(self.keys, KeyPolicies):
            raise ConfigurationError(f"keys must be KeyPolicies, got {self.keys!r}")

    def tier_cap(self, priority: int) -> int | None:
        """The concurrency cap of the tier ``priority`` (``None`` = unlimited)."""
        return tier_cap(self.tier_caps, priority)


def tier_cap(tier_caps: Mapping[int, int | None], priority: int) -> int | None:
    """The cap in force of the tier ``priority``: ``tier_caps``'s entry for it (``None`` =
    unlimited), else the priority value itself.

    Example:
        >>> tier_cap({4: 6, 8: None}, 4), tier_cap({4: 6, 8: None}, 8), tier_cap({}, 3)
        (6, None, 3)
    """
    return tier_caps.get(priority, priority)


class JobState(enum.Enum):
    """Where a job is in its life inside the core."""

    PENDING = "pending"
    RUNNING = "running"


class BlockReason(enum.Enum):
    """Why a pending job cannot be admitted right now."""

    CAPACITY = "capacity"
    """Every global slot is in use."""
    TIER_CAP = "tier_cap"
    """Its priority tier runs as many jobs as the tier cap allows."""
    TYPE_CAP = "type_cap"
    """Its job type runs ``max_concurrency`` jobs."""
    CONFLICT = "conflict"
    """A job of the same conflict group on the same ``job_id`` is running."""
    KEY_CAP = "key_cap"
    """Its fairness key runs its ``max_concurrency`` jobs."""
    TENANT_CAP = "tenant_cap"
    """With two-level keys, its key's tenant runs its ``max_concurrency`` jobs over all its
    keys."""
    PAUSED = "paused"
    """Its fairness key or its job type is paused."""
    RATE_LIMIT = "rate_limit"
    """Its fairness key, its key's tenant or its type used up its rate (``KeyPolicy.rate``)
    until its bucket refills."""


#: The order of precedence of the reasons: the reason a blocked job counts under in
#: ``blocked_counts`` is the first that applies, and ``Scheduler.why`` lists them in this order.
BLOCK_ORDER = (
    BlockReason.PAUSED,
    BlockReason.RATE_LIMIT,
    BlockReason.CONFLICT,
    BlockReason.KEY_CAP,
    BlockReason.TENANT_CAP,
    BlockReason.TYPE_CAP,
    BlockReason.TIER_CAP,
    BlockReason.CAPACITY,
)


class CancelOutcome(enum.Enum):
    """The result of cancelling a job."""

    CANCELLED = "cancelled"
    """The job was pending and is gone; it will never be admitted."""
    RUNNING = "running"
    """The job was already admitted; cancelling it is the caller's business."""
    UNKNOWN = "unknown"
    """The core holds no job with that reference."""


def check_priority(priority: object) -> None:
    """Refuse a job's own priority that is not ``None`` or a positive int (never a bool)."""
    if priority is not None and not (type(priority) is int and priority >= 1):
        raise SchedulerError(f"priority must be a positive int, got {priority!r}")


def declared_priorities(
    types: Iterable[JobType], tier_caps: Mapping[int, int | None]
) -> frozenset[int]:
    """The priorities a job's own priority may take: every job type's, and every tier
    ``tier_caps`` names. Any other would open a tier nobody declared, capped at its own value
    and ranked by it (``10**9``: ahead of every tier, with a cap of a billion). Aging's
    ``max_effective_priority`` and ``urgent_threshold`` are levels a job rises to, not tiers:
    they declare none.

    >>> sorted(declared_priorities([JobType("clone", priority=8)], {9: 1}))
    [8, 9]
    """
    return frozenset({t.priority for t in types} | set(tier_caps))


def check_declared_priority(priority: object, declared: Collection[int]) -> None:
    """``check_priority``, and refuse a priority ``declared`` does not hold
    (``declared_priorities``).

    Raises:
        SchedulerError: ``priority`` is not ``None``, a positive int, or declared.
    """
    check_priority(priority)
    if priority is not None and priority not in declared:
        known = ", ".join(map(str, sorted(declared))) or "none"
        raise SchedulerError(
            f"priority {priority} is not declared: a job's own priority must be a job type's "
            f"priority or a tier of fair_tier_caps (declared: {known})"
        )


class PriorityOutcome(enum.Enum):
    """The result of giving a job another priority (``Scheduler.reprioritize``)."""

    OK = "ok"
    """The job was pending and now waits at its new priority."""
    RUNNING = "running"
    """The job was already admitted: its priority no longer matters."""
    UNKNOWN = "unknown"
    """The core holds no job with that reference."""


class Admission(NamedTuple):
    """The decision to start a job now.

    A ``NamedTuple`` rather than a frozen dataclass: one is built per decision, and it costs a
    quarter as much to build while being just as immutable.

    Attributes:
        estimate: The cost charged to ``fairness_key`` for this admission.
        token: A fencing token, strictly increasing across admissions of one scheduler.
        priority: The job's own priority: the tier whose cap it counts against.
        effective_priority: Its priority as aging had raised it when it was admitted
            (``None`` from callers that do not know it: then ``priority``).
        urgent: It had aged to the urgent threshold, so its key's cap did not hold it.
    """

    uid: JobUid
    type: str
    job_id: str | None
    fairness_key: str
    priority: int
    estimate: float
    token: int
    arrival: float
    admitted_at: float
    effective_priority: int | None = None
    urgent: bool = False

    @property
    def ref(self) -> JobUid:
        """The old name of ``uid``, kept for one release."""
        return self.uid


class Release(NamedTuple):
    """The result of completing or releasing a running job (a ``NamedTuple``, as ``Admission``).

    Attributes:
        elapsed: The observed wall time, or ``None`` for a release without observation.
        estimate: The estimate for ``(type, job_id)`` after this release.
    """

    uid: JobUid
    type: str
    job_id: str | None
    fairness_key: str
    elapsed: float | None
    estimate: float

    @property
    def ref(self) -> JobUid:
        """The old name of ``uid``, kept for one release."""
        return self.uid


@dataclass(frozen=True, slots=True)
class JobView:
    """One job as a snapshot shows it.

    Attributes:
        place: For a pending job, its 1-based position in the dispatch order among all
            pending jobs; ``None`` when running.
        place_in_key: Its 1-based position among the pending jobs of its fairness key.
        blocked_by: Why it cannot be admitted now; empty when it is admissible (it is then
            admitted at the next decision unless it is not first in the dispatch order).
        effective_priority: For a pending job, its priority as aging has raised it now; for a
            running one, as it was at admission.
        urgent: It has aged to the urgent threshold (see ``Aging``).
    """

    uid: JobUid
    type: str
    job_id: str | None
    fairness_key: str
    priority: int
    arrival: float
    state: JobState
    place: int | None
    place_in_key: int | None
    blocked_by: tuple[BlockReason, ...]
    effective_priority: int = 0
    urgent: bool = False

    @property
    def ref(self) -> JobUid:
        """The old name of ``uid``, kept for one release."""
        return self.uid


@dataclass(frozen=True, slots=True)
class ExpectedStart:
    """When a pending job is expected to start (``Scheduler.expected_start``).

    Attributes:
        seconds: Seconds from now; ``None`` when the model cannot say: the job waits for
            something no estimate measures (``waits_for``: a pause, or a type or tier cap).
        waits_for: The first reason that holds it back that the estimate does not wait out
            by itself (``PAUSED``, ``RATE_LIMIT``, ``TENANT_CAP``, ``TYPE_CAP``,
            ``TIER_CAP``), or ``KEY_CAP`` (then
            ``seconds`` is its key's jobs ahead at no more than its cap); ``None`` otherwise.
        from_defaults: The fraction (0 to 1) of the work ahead counted at a type's
            ``default_cost`` because nothing of that type was learned yet: near 1, the
            estimate is a guess from the configuration.
    """

    seconds: float | None
    waits_for: BlockReason | None = None
    from_defaults: float = 0.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The scheduler's state at one instant, for inspection, metrics and tests."""

    now: float
    capacity: int
    running: int
    pending: int
    running_by_tier: Mapping[int, int]
    running_by_type: Mapping[str, int]
    pending_by_key: Mapping[str, int]
    running_by_key: Mapping[str, int]
    accumulated_cost: Mapping[str, float]
    estimates: Mapping[tuple[str, str | None], float]
    jobs: tuple[JobView, ...]
    """Pending jobs in dispatch order, then running jobs in admission order."""
