"""The worker's ``fair_*`` settings: read once at startup, validated before anything runs."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from types import MappingProxyType
from typing import Any

from .core import Aging, CostLifecycle, JobType, KeyPolicies, SchedulerConfig, tier_cap
from .core.lanes import DEFAULT_LANE_SECONDS, DEFAULT_LANES, DEFAULT_THRESHOLD
from .core.types import TYPE_OPTIONS, declared_priorities
from .engine import OUTAGE_POLICIES
from .errors import ConfigurationError
from .protocol import DEFAULT_SHARDS, shard_count

__all__ = ["BAD_MESSAGE_POLICIES", "DEFAULTS", "FairSettings", "redact_url"]

BAD_MESSAGE_POLICIES = ("repair", "reject")

#: Every setting, its default, and what it means. docs/configuration.md documents each one.
DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "fair_types": {},  # {name: {"priority": int, "max_concurrency": ..., ...}}
        "fair_tier_caps": {},  # {priority: cap or None}
        # policies by fairness key: {name, glob pattern or "*": {"weight": w, "min_slots": m,
        # "max_concurrency": n, "max_priority": p}}; exact names first, then patterns in
        # order, then "*"
        "fair_keys": {},
        # priority aging for every type that sets none of its own: {"interval": s, "grace": s,
        # "max_effective_priority": p, "urgent_threshold": p}; None = no aging
        "fair_aging": None,
        # a fair task published by a running fair task takes its caller's aging clock (and so
        # its effective priority) instead of starting its own
        "fair_inherit_aging": False,
        # each fairness key's slot allocation (minimums, weights, caps) is its soft cap: a key
        # at its allocation yields to keys below theirs, and takes a slot nobody else can
        "fair_allocation_caps": False,
        # what a priority orders: "global" (every job of a higher priority first) or "key"
        # (the key to serve by fairness first; priority orders that key's own jobs)
        "fair_priority_scope": "global",
        # two-level keys: with "/", key "acme/alice" belongs to tenant "acme", and tenants are
        # served fairly first, then the keys within the chosen tenant; None = flat keys
        "fair_key_separator": None,
        "fair_pool": "prefork",  # the real pool that runs tasks
        "fair_capacity": None,  # slots; None = the pool's size, following autoscale
        # jobs admitted ahead of a free slot; None = sized by fair_reserve_seconds (1 to 8)
        # with a shared store, 0 alone; an int: that many, always
        "fair_lookahead": None,
        "fair_reserve_seconds": 0.01,  # the adaptive reserve covers this much of the pool's work
        "fair_max_held": 1000,  # messages one worker holds unacked at most
        "fair_max_hold_seconds": None,  # None = derived from the broker's ack timeout
        "fair_spill_interval": 5.0,  # seconds between two spills of excess held messages
        "fair_sweep_interval": 1.0,  # seconds between sweeps for revoked/expired/old holds
        "fair_alpha": 0.3,
        "fair_cost_ttl": 3600.0,
        "fair_estimate_ttl": 7 * 24 * 3600.0,
        "fair_reset_interval": None,
        "fair_advance_idle": False,
        "fair_default_fairness_key": "",
        # a submit with an idempotency_key publishes once per (fairness key, idempotency key)
        # within this many seconds (submissions.py)
        "fair_idempotency_seconds": 24 * 3600.0,
        # a duplicate of a submit not yet published waits this long for its outcome, then
        # raises SubmissionPending; a submit's pending record lapses after the second
        "fair_idempotency_wait_seconds": 10.0,
        "fair_idempotency_pending_seconds": 60.0,
        # Producers record each fair submission in the shared store until it ends
        # (submissions.py): job control then sees jobs still in the broker, and the limits
        # below can refuse a submit. Any limit turns it on.
        "fair_track_submits": False,
        "fair_track_seconds": 24 * 3600.0,  # an entry whose end is never reported lapses
        "fair_max_queued": None,  # submitted and not ended, fleet-wide; None = no limit
        # the same per fairness key: an int for every key, or {key: n, "*": n for the rest}
        "fair_max_queued_per_key": None,
        "fair_on_queue_full": "raise",  # or "return": apply_async returns the QueueFull
        "fair_max_header_length": 256,
        # a fair_submitted header earlier than this many seconds before the worker received
        # the message counts from then (one later than the receipt counts from the receipt)
        "fair_submitted_horizon_seconds": 3600.0,
        "fair_on_bad_message": "repair",  # or "reject": every bad message goes to dead letter
        "fair_dead_letter_queue": "celery_fair.dead_letter",
        # Fair shard queues (routing.py): a fair job with a fairness key goes to one of its
        # queue's N shards, by its key; a fair worker consumes them all. 1 = no shards.
        "fair_shards": DEFAULT_SHARDS,
        # Lanes (core/lanes.py, docs/operations.md#lanes): a key that one producer publishes
        # more than fair_lane_threshold jobs of within a second gets a queue of its own, one
        # of each queue's fair_lanes lanes, assigned by the shared store; a key whose lease
        # (fair_lane_seconds) lapsed leaves its lane once the lane is empty. 0 = no lanes.
        "fair_lanes": DEFAULT_LANES,
        "fair_lane_threshold": DEFAULT_THRESHOLD,
        "fair_lane_seconds": DEFAULT_LANE_SECONDS,
        # The intake (intake/): seconds between two looks at a queue for fair messages that
        # producers published to it, while there is nothing to move; None = no intake.
        "fair_intake_interval": 0.05,
        # Shared state (docs/store.md): None = the broker's Redis when the broker is Redis,
        # else this worker alone; "memory" = this worker alone; or a redis:// URL.
        "fair_store_url": None,
        "fair_store_prefix": "celery_fair",
        "fair_lease_seconds": 30.0,
        "fair_store_outage": "hold",  # or "local"
        "fair_store_poll_interval": 0.5,
        "fair_dedupe_seconds": 60.0,
        # In-process work (slots.py): how many ``fair.slot`` blocks one process (a web server)
        # runs at once; more callers wait their turn, in fair order
        "fair_slot_capacity": 4,
        # Prometheus metrics (metrics.py, docs/metrics.md): the port this worker serves
        # /metrics on (0: one the OS picks, shown by inspect stats); None = no metrics.
        "fair_metrics_port": None,
        "fair_metrics_address": "0.0.0.0",
        # keys named by celery_fair_key_head_wait_seconds (the longest waits; the rest as
        # "other"); 0 names none
        "fair_metrics_top_keys": 10,
    }
)

QUEUE_FULL = ("raise", "return")

STORE_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "sentinel")

_TYPE_OPTIONS = set(TYPE_OPTIONS)


@dataclass(frozen=True, slots=True)
class FairSettings:
    """Validated ``fair_*`` settings. Build with ``from_celery_conf(app.conf)``.

    Example:
        >>> s = FairSettings.from_mapping({"fair_max_held": 200})
        >>> s.max_held, s.pool
        (200, 'prefork')
    """

    types: Mapping[str, JobType] = field(default_factory=dict)
    tier_caps: Mapping[int, int | None] = field(default_factory=dict)
    keys: KeyPolicies = field(default_factory=KeyPolicies)
    aging: Aging | None = None
    inherit_aging: bool = False
    allocation_caps: bool = False
    priority_scope: str = "global"
    key_separator: str | None = None
    pool: str = "prefork"
    capacity: int | None = None
    lookahead: int | None = None
    reserve_seconds: float = 0.01
    max_held: int = 1000
    max_hold_seconds: float | None = None
    spill_interval: float = 5.0
    sweep_interval: float = 1.0
    alpha: float = 0.3
    lifecycle: CostLifecycle = field(default_factory=CostLifecycle)
    default_fairness_key: str = ""
    idempotency_seconds: float = 24 * 3600.0
    idempotency_wait_seconds: float = 10.0
    idempotency_pending_seconds: float = 60.0
    track_submits: bool = False
    track_seconds: float = 24 * 3600.0
    max_queued: int | None = None
    max_queued_per_key: Mapping[str, int] = field(default_factory=dict)
    on_queue_full: str = "raise"
    max_header_length: int = 256
    submitted_horizon_seconds: float = 3600.0
    on_bad_message: str = "repair"
    dead_letter_queue: str = "celery_fair.dead_letter"
    shards: int = DEFAULT_SHARDS
    lanes: int = DEFAULT_LANES
    lane_threshold: int = DEFAULT_THRESHOLD
    lane_seconds: float = DEFAULT_LANE_SECONDS
    intake_interval: float | None = 0.05
    store_url: str | None = None
    store_prefix: str = "celery_fair"
    lease_seconds: float = 30.0
    store_outage: str = "hold"
    store_poll_interval: float = 0.5
    dedupe_seconds: float = 60.0
    slot_capacity: int = 4
    metrics_port: int | None = None
    metrics_address: str = "0.0.0.0"
    metrics_top_keys: int = 10

    @classmethod
    def from_celery_conf(cls, conf: Any) -> FairSettings:
        """Read every ``fair_*`` setting from a Celery configuration (``app.conf``).

        A ``fair_*`` name that is not a setting (a typo) is an error, not silently ignored.
        """
        values = {name: conf.get(name, default) for name, default in DEFAULTS.items()}
        values.update(
            (name, conf[name])
            for name in list(conf.keys())
            if isinstance(name, str) and name.startswith("fair_") and name not in DEFAULTS
        )
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> FairSettings:
        """Validate ``values`` (names as in ``DEFAULTS``; missing ones take the default).

        Raises:
            ConfigurationError: A value is invalid; the message names the setting.
        """
        unknown = sorted(name for name in values if name not in DEFAULTS)
        if unknown:
            raise ConfigurationError(f"unknown celery-fair setting(s): {', '.join(unknown)}")
        v = {**DEFAULTS, **values}
        lifecycle = _setting(
            "fair_cost_ttl/fair_estimate_ttl/fair_reset_interval/fair_advance_idle",
            lambda: CostLifecycle(
                cost_ttl=v["fair_cost_ttl"],
                estimate_ttl=v["fair_estimate_ttl"],
                reset_interval=v["fair_reset_interval"],
                advance_idle=v["fair_advance_idle"],
            ),
        )
        settings = cls(
            types=_parse_types(v["fair_types"]),
            tier_caps=_parse_tier_caps(v["fair_tier_caps"]),
            keys=_parse_keys(v["fair_keys"]),
            aging=_parse_aging("fair_aging", v["fair_aging"]),
            inherit_aging=_bool("fair_inherit_aging", v["fair_inherit_aging"]),
            allocation_caps=_bool("fair_allocation_caps", v["fair_allocation_caps"]),
            priority_scope=_setting(
                "fair_priority_scope",
                lambda: SchedulerConfig(1, priority_scope=v["fair_priority_scope"]).priority_scope,
            ),
            key_separator=_setting(
                "fair_key_separator",
                lambda: SchedulerConfig(1, key_separator=v["fair_key_separator"]).key_separator,
            ),
            pool=_text("fair_pool", v["fair_pool"]),
            capacity=_optional_int("fair_capacity", v["fair_capacity"], minimum=1),
            lookahead=_optional_int("fair_lookahead", v["fair_lookahead"], minimum=0),
            reserve_seconds=_seconds("fair_reserve_seconds", v["fair_reserve_seconds"]),
            max_held=_int("fair_max_held", v["fair_max_held"], minimum=1),
            max_hold_seconds=_optional_seconds("fair_max_hold_seconds", v["fair_max_hold_seconds"]),
            spill_interval=_seconds("fair_spill_interval", v["fair_spill_interval"]),
            sweep_interval=_seconds("fair_sweep_interval", v["fair_sweep_interval"]),
            alpha=_setting("fair_alpha", lambda: SchedulerConfig(1, alpha=v["fair_alpha"]).alpha),
            lifecycle=lifecycle,
            default_fairness_key=_key("fair_default_fairness_key", v["fair_default_fairness_key"]),
            idempotency_seconds=_seconds("fair_idempotency_seconds", v["fair_idempotency_seconds"]),
            idempotency_wait_seconds=_seconds(
                "fair_idempotency_wait_seconds", v["fair_idempotency_wait_seconds"]
            ),
            idempotency_pending_seconds=_seconds(
                "fair_idempotency_pending_seconds", v["fair_idempotency_pending_seconds"]
            ),
            track_submits=_bool("fair_track_submits", v["fair_track_submits"]),
            track_seconds=_seconds("fair_track_seconds", v["fair_track_seconds"]),
            max_queued=_optional_int("fair_max_queued", v["fair_max_queued"], minimum=1),
            max_queued_per_key=_per_key_limits(v["fair_max_queued_per_key"]),
            on_queue_full=_choice("fair_on_queue_full", v["fair_on_queue_full"], QUEUE_FULL),
            max_header_length=_int("fair_max_header_length", v["fair_max_header_length"], 1),
            submitted_horizon_seconds=_seconds(
                "fair_submitted_horizon_seconds", v["fair_submitted_horizon_seconds"]
            ),
            on_bad_message=_choice(
                "fair_on_bad_message", v["fair_on_bad_message"], BAD_MESSAGE_POLICIES
            ),
            dead_letter_queue=_text("fair_dead_letter_queue", v["fair_dead_letter_queue"]),
            shards=shard_count({"fair_shards": v["fair_shards"]}),
            lanes=_int("fair_lanes", v["fair_lanes"], minimum=0),
            lane_threshold=_int("fair_lane_threshold", v["fair_lane_threshold"], minimum=1),
            lane_seconds=_seconds("fair_lane_seconds", v["fair_lane_seconds"]),
            intake_interval=_optional_seconds("fair_intake_interval", v["fair_intake_interval"]),
            store_url=_store_url(v["fair_store_url"]),
            store_prefix=_prefix(v["fair_store_prefix"]),
            lease_seconds=_seconds("fair_lease_seconds", v["fair_lease_seconds"]),
            store_outage=_choice("fair_store_outage", v["fair_store_outage"], OUTAGE_POLICIES),
            store_poll_interval=_seconds("fair_store_poll_interval", v["fair_store_poll_interval"]),
            dedupe_seconds=_non_negative("fair_dedupe_seconds", v["fair_dedupe_seconds"]),
            slot_capacity=_int("fair_slot_capacity", v["fair_slot_capacity"], minimum=1),
            metrics_port=_optional_int("fair_metrics_port", v["fair_metrics_port"], minimum=0),
            metrics_address=_text("fair_metrics_address", v["fair_metrics_address"]),
            metrics_top_keys=_int("fair_metrics_top_keys", v["fair_metrics_top_keys"], minimum=0),
        )
        if settings.metrics_port is not None and settings.metrics_port > 65535:
            raise ConfigurationError("fair_metrics_port: a TCP port, 0 to 65535")
        if len(settings.default_fairness_key) > settings.max_header_length:
            raise ConfigurationError(
                "fair_default_fairness_key: longer than fair_max_header_length"
            )
        return settings

    @property
    def tracking(self) -> bool:
        """Whether producers record their submissions (asked for, or needed by a limit)."""
        return self.track_submits or self.max_queued is not None or bool(self.max_queued_per_key)

    def key_queue_limit(self, fairness_key: str) -> int | None:
        """``fair_max_queued_per_key`` for ``fairness_key``: its own, else ``"*"``'s."""
        limits = self.max_queued_per_key
        return limits.get(fairness_key, limits.get("*"))

    def declared_priorities(self, types: Iterable[JobType]) -> frozenset[int]:
        """The priorities a job's own ``fair_priority`` may take, given every job type
        (``declared_priorities``: the types' and ``fair_tier_caps``'s)."""
        return declared_priorities(types, self.tier_caps)

    def tier_cap(self, priority: int) -> int | None:
        """The cap in force of the tier ``priority``: ``fair_tier_caps``'s, else its value."""
        return tier_cap(self.tier_caps, priority)

    def scheduler_config(self, capacity: int) -> SchedulerConfig:
        return SchedulerConfig(
            capacity=capacity,
            tier_caps=self.tier_caps,
            alpha=self.alpha,
            lifecycle=self.lifecycle,
            keys=self.keys,
            aging=self.aging,
            allocation_caps=self.allocation_caps,
            priority_scope=self.priority_scope,
            key_separator=self.key_separator,
        )

    def describe(self) -> dict[str, object]:
        """The effective settings, for the startup log line and ``inspect stats``."""
        return {
            "types": {name: _type_options(t) for name, t in self.types.items()},
            "tier_caps": dict(self.tier_caps),
            "keys": _describe_keys(self.keys),
            "aging": None if self.aging is None else describe_aging(self.aging),
            "allocation_caps": self.allocation_caps,
            "priority_scope": self.priority_scope,
            "key_separator": self.key_separator,
            "pool": self.pool,
            "capacity": self.capacity or "pool size",
            "lookahead": self.lookahead if self.lookahead is not None else "adaptive",
            "reserve_seconds": self.reserve_seconds,
            "max_held": self.max_held,
            "max_hold_seconds": self.max_hold_seconds or "from broker",
            "on_bad_message": self.on_bad_message,
            "submitted_horizon_seconds": self.submitted_horizon_seconds,
            "store": redact_url(self.store_url) if self.store_url else "from broker",
            "store_prefix": self.store_prefix,
            "lease_seconds": self.lease_seconds,
            "store_outage": self.store_outage,
            "lanes": self.lanes,
            "track_submits": self.tracking,
            "metrics": "off"
            if self.metrics_port is None
            else f"{self.metrics_address}:{self.metrics_port}",
        }


def merge_type(known: dict[str, JobType], jtype: JobType, where: str) -> None:
    """Add ``jtype`` to ``known``; an equal declaration is fine, a different one is an error."""
    existing = known.get(jtype.name)
    if existing is not None and existing != jtype:
        raise ConfigurationError(
            f"job type {jtype.name!r} is declared twice with different options: "
            f"{_type_options(existing)} and {_type_options(jtype)} ({where})"
        )
    known[jtype.name] = jtype


def _type_options(jtype: JobType) -> dict[str, object]:
    return {
        "priority": jtype.priority,
        "max_concurrency": jtype.max_concurrency,
        "conflict_group": jtype.conflict_group,
        "default_cost": jtype.default_cost,
        "aging": None if jtype.aging is None else describe_aging(jtype.aging),
        "rate": jtype.rate,
        "burst": jtype.burst,
        "per": jtype.per,
    }


def _parse_types(value: object) -> Mapping[str, JobType]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"fair_types: must be a mapping of name to options, got {value!r}")
    types: dict[str, JobType] = {}
    for name, options in value.items():
        where = f"fair_types[{name!r}]"
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"{where}: must be a mapping of options, got {options!r}")
        extra = set(options) - _TYPE_OPTIONS
        if extra:
            raise ConfigurationError(f"{where}: unknown option(s) {sorted(extra)}")
        if "priority" not in options:
            raise ConfigurationError(f"{where}: priority is required")
        options = dict(options)
        if options.get("aging") is not None:
            options["aging"] = _parse_aging(f"{where}.aging", options["aging"])
        jtype = _setting(where, lambda: JobType(name=name, **options))  # noqa: B023
        merge_type(types, jtype, where)
    return MappingProxyType(types)


def _parse_aging(name: str, value: object) -> Aging | None:
    if value is None:
        return None
    aging: Aging = _setting(name, lambda: Aging.from_mapping(value))  # type: ignore[arg-type]
    return aging


def describe_aging(aging: Aging) -> dict[str, object]:
    """``aging`` as the mapping it is configured with."""
    return asdict(aging)


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name}: must be True or False, got {value!r}")
    return value


def _parse_tier_caps(value: object) -> Mapping[int, int | None]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"fair_tier_caps: must be a mapping, got {value!r}")
    caps = {int(k) if isinstance(k, str) and k.isdigit() else k: c for k, c in value.items()}
    _setting("fair_tier_caps", lambda: SchedulerConfig(1, tier_caps=caps))
    return MappingProxyType(caps)


def _parse_keys(value: object) -> KeyPolicies:
    if not isinstance(value, Mapping):
        raise ConfigurationError(f"fair_keys: must be a mapping, got {value!r}")
    for name in value:
        if not isinstance(name, str):
            raise ConfigurationError(f"fair_keys: a key name or pattern is a string, got {name!r}")
    policies: KeyPolicies = _setting("fair_keys", lambda: KeyPolicies.from_mapping(value))
    return policies


def _describe_keys(keys: KeyPolicies) -> dict[str, dict[str, object]]:
    def options(policy: Any) -> dict[str, object]:
        out: dict[str, object] = {}
        if policy.weight != 1:
            out["weight"] = policy.weight
        if policy.max_concurrency is not None:
            out["max_concurrency"] = policy.max_concurrency
        return out

    described = {name: options(p) for name, p in keys.exact.items()}
    described.update((pattern, options(p)) for pattern, p in keys.patterns)
    if not keys.trivial and options(keys.default):
        described["*"] = options(keys.default)
    return described


def _setting(name: str, build: Any) -> Any:
    try:
        return build()
    except ConfigurationError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
    except TypeError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None


def _int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigurationError(f"{name}: must be an int >= {minimum}, got {value!r}")
    return value


def _optional_int(name: str, value: object, minimum: int) -> int | None:
    return None if value is None else _int(name, value, minimum)


def _seconds(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name}: must be a positive number of seconds, got {value!r}")
    return float(value)


def _optional_seconds(name: str, value: object) -> float | None:
    return None if value is None else _seconds(name, value)


def _non_negative(name: str, value: object) -> float:
    if value == 0 and not isinstance(value, bool):
        return 0.0
    return _seconds(name, value)


def _store_url(value: object) -> str | None:
    if value is None or value == "memory":
        return value
    url = _text("fair_store_url", value)
    scheme = url.partition("://")[0]
    if scheme not in STORE_SCHEMES:
        raise ConfigurationError(
            f"fair_store_url: must be 'memory' or a {'/'.join(STORE_SCHEMES)}:// URL, got "
            f"{redact_url(url)!r}"
        )
    return url


def _prefix(value: object) -> str:
    prefix = _text("fair_store_prefix", value)
    if "{" in prefix or "}" in prefix:
        raise ConfigurationError(f"fair_store_prefix: must not contain braces, got {prefix!r}")
    return prefix


def redact_url(url: str) -> str:
    """``url`` without its passwords, for logs: each part's of a Sentinel URL (``;``), and a
    ``sentinel_password`` in the query."""
    parts = []
    for part in url.split(";"):
        scheme, sep, rest = part.partition("://")
        userinfo, at, host = rest.rpartition("@")
        if at and ":" in userinfo:
            rest = f"{userinfo.split(':', 1)[0]}:***@{host}"
        parts.append(re.sub(r"(sentinel_password=)[^&]*", r"\1***", f"{scheme}{sep}{rest}"))
    return ";".join(parts)


def _text(name: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{name}: must be a non-empty string, got {value!r}")
    return value


def _key(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigurationError(f"{name}: must be a string, got {value!r}")
    return value


def _per_key_limits(value: object) -> Mapping[str, int]:
    name = "fair_max_queued_per_key"
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        return MappingProxyType({"*": _int(name, value, minimum=1)})
    limits = {}
    for key, limit in value.items():
        if not isinstance(key, str):
            raise ConfigurationError(f"{name}: keys are fairness keys (strings), got {key!r}")
        limits[key] = _int(f"{name}[{key!r}]", limit, minimum=1)
    return MappingProxyType(limits)


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigurationError(f"{name}: must be one of {', '.join(choices)}; got {value!r}")
    return str(value)
