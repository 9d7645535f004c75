"""The store scripts' arguments, by name: one table for the Python side that packs them and the
Lua side that reads them.

Every script's ARGV starts with ``HEAD``; then come lists whose entries have a fixed stride:
finished jobs (``FINISHED``), jobs to admit (``Ask``'s fields, in order) and jobs to register
again (``Running``'s fields). The replies' status codes come from here too: each admission's
verdict is a ``Verdict`` value (store/base.py) and each finished job's status is
``FINISH_APPLIED`` or ``FINISH_STALE``.

``lua_constants`` turns both into the Lua locals the scripts use, prepended to each script: the
ARGV positions (``ARGV[H_WORKER]``, ``ARGV[b + ASK_COST]``) and the codes (``V_TIER_CAP`` is
``Verdict.TIER_CAP``'s value, ``F_STALE`` is ``FINISH_STALE``). ``tests/unit/test_wire.py``
checks that the Python packers put each value where the table says, that no script indexes
ARGV by a bare number, and that no script writes a status code as a bare string.

The lane table's script (``lua/lanes.lua``) gets its operations' names (``OP_READ``...), a
sweep's arguments (``SWEEP_<NAME>``), the lane rule's constants (``LANE_GRACE``,
``LANE_EMPTY_SWEEPS``, ``LANE_ANNOUNCE_GRACE``: core/lanes.py's ``GRACE``, ``EMPTY_SWEEPS`` and
``ANNOUNCE_GRACE``) and the unit of a new
table's version (``LANE_VERSION_TICKS_PER_S``) from here too.
"""

from __future__ import annotations

import re

from ..core.lanes import ANNOUNCE_GRACE, EMPTY_SWEEPS, GRACE
from ..core.rates import FULL_START
from .base import Ask, Running, Verdict

__all__ = [
    "ASK",
    "FINISHED",
    "FINISH_APPLIED",
    "FINISH_STALE",
    "HEAD",
    "LANE_ASK",
    "LANE_OPS",
    "LANE_READ",
    "LANE_RENEW",
    "LANE_SWEEP",
    "LANE_VERSION_TICKS_PER_S",
    "RENEW_EVERY",
    "RUNNING",
    "SWEEP",
    "TOKEN_LOW_BITS",
    "TOKEN_TICKS_PER_S",
    "first_lane_version",
    "first_token",
    "lease_held_for",
    "lua_constants",
    "pack_token",
    "unpack_token",
]

#: An admission renews its worker's lease only once this share of a lease has passed since the
#: last renewal (a heartbeat or a registration always renews it), so that a busy worker does
#: not rewrite its lease with every admission. Lua: ``RENEW_EVERY`` (common.lua, ``renew``).
RENEW_EVERY = 0.25


def lease_held_for(lease: float) -> float:
    """Seconds after sending a call that succeeded during which its worker's lease surely
    holds: the call renewed it, or found it renewed less than ``RENEW_EVERY`` of a lease
    before (the engine's rule for reserved jobs, engine.py ``Engine.vet``)."""
    return lease * (1 - RENEW_EVERY)


#: A fencing token is ``high * 2**TOKEN_LOW_BITS + low``. A store that is created (its first
#: call ever, or the first after its Redis came back empty) starts ``high`` at its creation
#: time in milliseconds by its own clock (Redis's ``TIME``), ``low`` at 0, and then raises both
#: to the highest token the calling worker has seen, if that is higher. Each admission adds
#: one to ``low``, which carries into ``high`` when it reaches ``2**TOKEN_LOW_BITS``. So tokens
#: keep rising across a store that comes back empty, even when no worker survives to remember
#: the old ones: a store's tokens stay below the next store's first unless it admitted more
#: than 2**20 jobs per millisecond of its life. Both halves stay exact integers in Lua's doubles
#: (below 2**53), and cross the script boundary as ``"high:low"`` (``pack_token``); replies
#: carry them as two integers. Lua: ``TOKEN_LOW`` (= 2**TOKEN_LOW_BITS).
TOKEN_LOW_BITS = 20
#: The high half's unit: a new store's first token is above its creation time in these
#: (milliseconds). Lua: ``TOKEN_TICKS_PER_S``.
TOKEN_TICKS_PER_S = 1000


def pack_token(token: int) -> str:
    """A token as the scripts take it: ``"high:low"``.

    >>> pack_token((1700000000000 << TOKEN_LOW_BITS) + 7)
    '1700000000000:7'
    """
    high, low = divmod(token, 1 << TOKEN_LOW_BITS)
    return f"{high}:{low}"


def unpack_token(high: int | str | bytes, low: int | str | bytes) -> int:
    """A token from its two halves (as a script replies them, or as ``"high:low"`` splits)."""
    return (int(high) << TOKEN_LOW_BITS) + int(low)


def first_token(now: float) -> int:
    """The token before the first one of a store created at ``now`` (seconds)."""
    return int(now * TOKEN_TICKS_PER_S) << TOKEN_LOW_BITS


#: A lane table's version (``Store.lanes``) starts at the table's creation time in these
#: (microseconds) and goes up by one with each change of the map, so a table created later (in
#: a store that came back empty) never repeats a version an earlier one gave, unless that one
#: changed more than once per microsecond of its life. Producers compare versions for
#: inequality only. A version stays below 2**53 (exact in Lua's doubles) until the year 2255.
#: Lua: ``LANE_VERSION_TICKS_PER_S``.
LANE_VERSION_TICKS_PER_S = 1_000_000


def first_lane_version(now: float) -> int:
    """The version of a lane table created at ``now`` (seconds).

    >>> first_lane_version(1700000000.25)
    1700000000250000
    """
    return int(now * LANE_VERSION_TICKS_PER_S)


#: The head of every script's ARGV (1-based in Lua: ``H_<NAME>``).
HEAD = (
    "schema",  # the store's schema version
    "epoch",  # the epoch the caller last saw ('' for none)
    "worker",
    "lease",  # seconds
    "recovery",  # the recovery window, seconds
    "cost_ttl",  # '' = none
    "estimate_ttl",  # '' = none
    "reset_interval",  # '' = none
    "advance_idle",  # '1' or '0'
    "alpha",
    "dedupe",  # seconds a tombstone is kept ('0' = none)
    "token_seen",  # the highest fencing token the caller has seen, "high:low" ('' = none)
)
#: A finished job, as complete and admit take them (``FIN_<NAME>``, offsets from its first).
FINISHED = ("uid", "token", "elapsed", "how")
#: A job to admit (``ASK_<NAME>``).
ASK = Ask._fields
#: A running job registered again with a store that lost it (``RUN_<NAME>``).
RUNNING = Running._fields

#: The lane table's operations (``lua/lanes.lua``), each sent right after the head. Lua:
#: ``OP_READ``, ``OP_ASK``, ``OP_RENEW``, ``OP_SWEEP``.
LANE_READ, LANE_ASK, LANE_RENEW, LANE_SWEEP = "read", "ask", "renew", "sweep"
LANE_OPS = (LANE_READ, LANE_ASK, LANE_RENEW, LANE_SWEEP)
#: A lane sweep's arguments after its operation (``SWEEP_<NAME>``): the lanes its worker
#: consumes, the assignments' lease (seconds), and how many lanes it looked at; then those
#: lanes, then the ones among them it found empty (to the end).
SWEEP = ("size", "lease", "looked")

_LISTS = (("FIN", FINISHED), ("ASK", ASK), ("RUN", RUNNING), ("SWEEP", SWEEP))

#: What a script replies for each finished job it was given (``Finished.applied``): released
#: (with the estimate after learning), or stale (its record gone or under another token, so
#: nothing changed). Lua: ``F_APPLIED``, ``F_STALE`` (common.lua, ``finish_jobs``).
FINISH_APPLIED = "ok"
FINISH_STALE = "stale"


def lua_constants(using: str | None = None) -> str:
    """The Lua locals for the table above: ``HEAD`` and ``H_<NAME>`` (ARGV positions), per
    list ``<P>_N`` (its stride) and ``<P>_<NAME>`` (offsets from an entry's first value), the
    reply codes (``V_<NAME>`` for each ``Verdict`` member, ``F_APPLIED`` and ``F_STALE``), and
    the lane table's operations (``OP_<NAME>``) and constants.

    With ``using`` (a script's whole text), only the names that text uses: a Lua function
    holds at most 200 locals, and a script's main function holds every one of these."""

    used = None if using is None else set(re.findall(r"\b[A-Z][A-Z0-9_]*\b", using))

    def wanted(name: str) -> bool:
        return used is None or name in used

    lines = ["-- generated from celery_fair/store/wire.py: ARGV positions, strides and reply codes"]
    single = {
        "HEAD": len(HEAD),
        "RENEW_EVERY": RENEW_EVERY,
        "TOKEN_LOW": 1 << TOKEN_LOW_BITS,
        "TOKEN_TICKS_PER_S": TOKEN_TICKS_PER_S,
        "LANE_VERSION_TICKS_PER_S": LANE_VERSION_TICKS_PER_S,
        "LANE_GRACE": float(GRACE),
        "LANE_EMPTY_SWEEPS": int(EMPTY_SWEEPS),
        "LANE_ANNOUNCE_GRACE": float(ANNOUNCE_GRACE),
        "RATE_FULL_START": float(FULL_START),
    }
    lines += [f"local {name} = {value!r}" for name, value in single.items() if wanted(name)]
    groups: list[tuple[str | None, dict[str, str]]] = [
        (None, {f"H_{name.upper()}": str(i + 1) for i, name in enumerate(HEAD)})
    ]
    for prefix, fields in _LISTS:
        groups.append((None, {f"{prefix}_N": str(len(fields))}))
        groups.append((None, {f"{prefix}_{name.upper()}": str(i) for i, name in enumerate(fields)}))
    # The codes are plain lowercase words (test_wire.py), so quoting needs no escapes.
    groups.append(
        (
            "-- reply codes: admission verdicts (store/base.py, Verdict), finished jobs",
            {f"V_{v.name}": f"'{v.value}'" for v in Verdict},
        )
    )
    groups.append((None, {"F_APPLIED": f"'{FINISH_APPLIED}'", "F_STALE": f"'{FINISH_STALE}'"}))
    groups.append(
        (
            "-- the lane table's operations (lua/lanes.lua)",
            {f"OP_{op.upper()}": f"'{op}'" for op in LANE_OPS},
        )
    )
    for comment, values in groups:
        kept = {name: value for name, value in values.items() if wanted(name)}
        if not kept:
            continue
        if comment is not None:
            lines.append(comment)
        if len(values) == 1:
            ((name, value),) = kept.items()
            lines.append(f"local {name} = {value}")
        else:
            lines.append(f"local {', '.join(kept)} =\n  {', '.join(kept.values())}")
    return "\n".join(lines) + "\n"
