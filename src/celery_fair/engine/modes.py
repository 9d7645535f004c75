"""Who decides admissions, and what the engine owes the store: one transition table.

The engine's state toward the store is a **mode** and a set of **pending syncs**:

=========  ==================================================================================
mode       what ``decide`` does
=========  ==================================================================================
alone      no store: the core admits at once; no store calls
shared     the store confirms every admission; pending syncs are served first, in the order
           ``SYNC_ORDER`` gives (a register call, then a beat for the policies)
hold       the store is unreachable: nothing new is admitted; a beat probes the store once the
           backoff has passed
local      the store is unreachable: admissions on this worker's share of each cap, never a
           job with a conflict (outage.py); a beat probes the store once the backoff has passed
=========  ==================================================================================

=============  ===================================================================================
sync           owed because                                 served by
=============  ===================================================================================
register       jobs run here that the store does not count  a register call; done when answered
reconcile      the store counts jobs here that ended         the same call, listing all this
                                                             worker has (``keep``)
policies       the store refused a job as paused, so the     a beat (the policies' version is
               runtime policies here are behind              read whole again); done when sent
=============  ===================================================================================

Every event that changes either is a row of ``TABLE``; nothing else sets them. A pair of mode
and event that the table does not move leaves the mode as it is.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

__all__ = ["OUTAGE", "SYNC_ORDER", "TABLE", "Event", "Mode", "State", "Sync"]


class Mode(str, enum.Enum):
    """Who decides admissions right now."""

    ALONE = "alone"  # no store: the core decides
    SHARED = "shared"  # the store confirms every admission
    HOLD = "hold"  # the store is unreachable: admit nothing new
    LOCAL = "local"  # the store is unreachable: admit on this worker's share of each cap


class Sync(enum.Enum):
    """Something the engine owes the store before it admits more (see the module table)."""

    REGISTER = "register"
    RECONCILE = "reconcile"
    POLICIES = "policies"


class Event(enum.Enum):
    """What the engine learns of the store (see ``TABLE``)."""

    UNREACHABLE = "a store call failed"
    ANSWERED = "a store call succeeded"
    RUNS_UNKNOWN = "jobs run here that the store does not count (admitted during an outage)"
    LOST = "the store lost jobs of this worker (its lease lapsed, or it came back empty)"
    EXTRA = "the store counts jobs of this worker that ended (a release lost in a failover)"
    REGISTERED = "the store took a registration"
    PAUSED = "the store refused a job as paused"
    POLICIES_ASKED = "a beat that reads the runtime policies whole was sent"


#: Stands in ``TABLE`` for the outage mode this engine was configured with (hold or local).
OUTAGE = "outage"


class Transition(NamedTuple):
    moves: dict[Mode, Mode | str]  # mode before -> after (``OUTAGE``: the configured one)
    owes: frozenset[Sync] = frozenset()  # syncs the event makes pending
    settles: frozenset[Sync] = frozenset()  # syncs the event makes done


_REGISTER = frozenset({Sync.REGISTER})
_RESYNC = frozenset({Sync.REGISTER, Sync.RECONCILE})

#: The transition table: every event, the modes it moves, the syncs it owes and settles.
TABLE: dict[Event, Transition] = {
    Event.UNREACHABLE: Transition({Mode.SHARED: OUTAGE}),
    Event.ANSWERED: Transition({Mode.HOLD: Mode.SHARED, Mode.LOCAL: Mode.SHARED}),
    Event.RUNS_UNKNOWN: Transition({}, owes=_REGISTER),
    Event.LOST: Transition({}, owes=_REGISTER),
    Event.EXTRA: Transition({}, owes=_RESYNC),
    Event.REGISTERED: Transition({}, settles=_RESYNC),
    Event.PAUSED: Transition({}, owes=frozenset({Sync.POLICIES})),
    Event.POLICIES_ASKED: Transition({}, settles=frozenset({Sync.POLICIES})),
}

#: The order in which ``decide`` serves pending syncs in shared mode (reconcile rides on the
#: register call).
SYNC_ORDER = (Sync.REGISTER, Sync.POLICIES)


class State:
    """The engine's mode and pending syncs, moved only by ``on`` along ``TABLE``.

    Args:
        mode: The mode to start in (alone without a store, else shared).
        outage: The mode to enter when the store becomes unreachable (hold or local).
    """

    __slots__ = ("mode", "outage", "pending")

    def __init__(self, mode: Mode, outage: Mode) -> None:
        self.mode = mode
        self.outage = outage
        # pending: the syncs owed to the store; empty almost always, so decide checks it first.
        self.pending: set[Sync] = set()

    def on(self, event: Event) -> bool:
        """Take ``event`` along the table; whether the mode changed or a sync became owed."""
        row = TABLE[event]
        moved = False
        after = row.moves.get(self.mode)
        if after is not None:
            self.mode = after if isinstance(after, Mode) else self.outage
            moved = True
        pending = self.pending
        if row.owes and not row.owes <= pending:
            pending |= row.owes
            moved = True
        if row.settles:
            pending -= row.settles
        return moved

    def owes(self, sync: Sync) -> bool:
        return sync in self.pending

    def due(self) -> Sync | None:
        """The pending sync to serve first, if any."""
        pending = self.pending
        for sync in SYNC_ORDER:
            if sync in pending:
                return sync
        return None
