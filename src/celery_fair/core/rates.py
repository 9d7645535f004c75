"""Rate limits: the bucket rule, one place for the core and the stores.

A rate-limited fairness key has a *bucket*: a level that refills at ``rate`` per second up to
``burst`` (at least 1), and that each start of one of its jobs lowers by what the start costs:
1 with ``per = "job"``, the job's estimate (seconds of slot-time, unweighted) with
``per = "cost"``. A key may start a job while its level is at least 1 (``FULL_START``); the
start may take the level below 0 (a job of cost 30 under a rate of 1 per second leaves a debt
of 29 seconds), and the key then waits until the refill has paid that back and 1 more. So a
key never starts more than ``burst + rate * T`` jobs in any ``T`` seconds (with ``"cost"``: no
more than that in cost, but for what its last job costs beyond 1), the long-run rate is exact
whatever its jobs cost, and the next job's cost need not be known before it is chosen.

A bucket nobody has charged is full. The core keeps each key's bucket by its own clock
(``Scheduler``); a shared store keeps the fleet's in the same admission call that charges the
key's cost (store/lua/admit.lua, store/memory.py), by this same rule (``RATE_RULE`` names it,
and a test holds the Lua and the Python to it), and the core adopts the store's level.
"""

from __future__ import annotations

import re
from math import inf, nextafter

from ..errors import ConfigurationError

__all__ = [
    "FULL_START",
    "PER_OPTIONS",
    "RATE_RULE",
    "level_at",
    "may_start",
    "parse_rate",
    "refill_at",
    "start_charge",
    "valid_terms",
]

RATE_RULE = "bucket-v1"
"""The name of the bucket rule below; the store's scripts carry it too (store/wire.py)."""

FULL_START = 1.0
"""The level a bucket must hold for its key to start a job."""

PER_OPTIONS = ("job", "cost")
"""What a start charges a bucket: one per job, or the job's estimate."""

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*/\s*(\d*(?:\.\d*)?)\s*([smhd])\s*$")


def parse_rate(value: object, what: str = "rate") -> float:
    """A rate as ``"10/s"``, ``"600/m"``, ``"5000/h"``, ``"20/d"`` (also ``"1/5m"``: one per five
    minutes) or a number per second, in units per second: a finite number > 0.

    >>> parse_rate("600/m"), parse_rate("1/5m"), parse_rate(2.5)
    (10.0, 0.0033333333333333335, 2.5)

    Raises:
        ConfigurationError: ``value`` is no such rate.
    """
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be like '10/s', '600/m' or '5000/h', got {value!r}")
    if isinstance(value, int | float):
        per_second = float(value)
    elif isinstance(value, str) and (match := _RATE.match(value)):
        amount, span, unit = match.groups()
        seconds = (float(span) if span not in ("", ".") else 1.0) * _UNITS[unit]
        per_second = float(amount) / seconds if seconds > 0 else inf
    else:
        raise ConfigurationError(f"{what} must be like '10/s', '600/m' or '5000/h', got {value!r}")
    if not (0 < per_second < inf):
        raise ConfigurationError(f"{what} must be above 0 and finite, got {value!r}")
    return per_second


def valid_terms(rate: object, burst: object, per: object) -> tuple[float | None, float | None]:
    """A rule's rate terms, checked: ``rate`` as ``parse_rate`` takes it (or ``None``), ``burst``
    a number >= 1 (or ``None``: 1), ``per`` one of ``PER_OPTIONS``; the rate per second and the
    burst as floats. One check for a key's and a type's terms.

    Raises:
        ConfigurationError: A term is invalid, named in the message.
    """
    per_second = None if rate is None else parse_rate(rate)
    if burst is not None:
        if (
            isinstance(burst, bool)
            or not isinstance(burst, int | float)
            or not (1 <= burst < inf)  # NaN fails too
        ):
            raise ConfigurationError(f"burst must be a number >= 1, got {burst!r}")
        burst = float(burst)
    if per not in PER_OPTIONS:
        raise ConfigurationError(f"per must be one of {PER_OPTIONS}, got {per!r}")
    return per_second, burst


def level_at(level: float, stamp: float, now: float, rate: float, burst: float) -> float:
    """A bucket's level at ``now``: ``level`` at ``stamp`` plus what ``rate`` refilled since,
    no more than ``burst`` (a clock that went back refills nothing). O(1). The stores' Lua
    states it too (store/lua/common.lua, ``bucket_level``)."""
    if now <= stamp:
        return burst if level > burst else level
    filled = level + (now - stamp) * rate
    return burst if filled > burst else filled


def start_charge(per_cost: bool, estimate: float) -> float:
    """What one start charges its key's bucket: its estimate with ``per = "cost"``, else 1."""
    return estimate if per_cost else 1.0


def may_start(level: float) -> bool:
    """Whether a bucket at ``level`` lets its key start a job."""
    return level >= FULL_START


def refill_at(level: float, stamp: float, rate: float) -> float:
    """When a bucket at ``level`` (below ``FULL_START``) at ``stamp`` lets its key start again:
    the first time whose ``level_at`` does, so a wake booked for then finds it paid, however
    the division rounds. O(1): a step or two past the quotient."""
    at = stamp + (FULL_START - level) / rate
    while level + (at - stamp) * rate < FULL_START:
        at = nextafter(at, inf)
    return at
