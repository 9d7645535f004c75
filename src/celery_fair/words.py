"""Why a job waits, in English: the one place that words ``core.inspect.Why``.

The core decides and inspects in values (``core/inspect.py``); this module writes them out for
whoever shows them to a person: job control (``control.status``, from the values a worker's
``fair_status`` reply carries), ``fair.slot``'s timeout, and the command line and Flower through
job control. It sits in layer 3, beside the observer and the metrics, the lowest layer that
speaks to people: it needs the core alone (no Celery, no store), so the engine, both sides of
layer 5 and the tools can all use it.

Every phrase is made here, and a phrase another module must recognise is a constant here
(``ELSEWHERE``).
"""

from __future__ import annotations

from .core.inspect import Blocker, CapFull, ConflictHeld, Paused, RateLimited, SlotsBusy, Why
from .core.types import BlockReason

__all__ = ["ELSEWHERE", "FIRST", "line", "lines", "waits_for"]

ELSEWHERE = "held by a job on another worker"
"""How a conflict held on another worker is worded; job control replaces it by the holder it
asks the shared store for (``control.status``)."""

FIRST = "first in line: it starts at the next decision"
"""The one line for a job that nothing holds back and nothing comes before."""

_CAPS = {
    BlockReason.KEY_CAP: "key cap",
    BlockReason.TENANT_CAP: "tenant cap",
    BlockReason.TYPE_CAP: "type cap",
    BlockReason.TIER_CAP: "tier cap",
}


def line(blocker: Blocker) -> str:
    """One blocker in words, with its numbers, e.g. ``"type cap repack 3/3"``."""
    if isinstance(blocker, Paused):
        if blocker.type is not None:
            what = f"type {blocker.type}"
        elif blocker.key is not None:
            what = f"key {blocker.key!r}"
        else:
            what = f"tenant {blocker.tenant!r}"
        return f"paused ({what})"
    if isinstance(blocker, RateLimited):
        if blocker.key is None:
            whose = f"type {blocker.type!r}"
        else:
            whose = f"{'tenant' if blocker.tenant else 'key'} {blocker.key!r}"
        return f"rate limit of {whose}: refills in {blocker.refills_in:.1f} s"
    if isinstance(blocker, ConflictHeld):
        on = f"{blocker.group}:{blocker.job_id}"
        if blocker.holder is None:
            return f"conflict on {on} {ELSEWHERE}"
        return f"conflict on {on} held by task {blocker.holder} for {blocker.held_for:.1f} s"
    if isinstance(blocker, CapFull):
        named = blocker.reason in (BlockReason.KEY_CAP, BlockReason.TENANT_CAP)
        name = repr(blocker.name) if named else blocker.name
        cap = _CAPS[blocker.reason]
        said = f"{cap} {name} {blocker.running + blocker.elsewhere}/{blocker.limit}"
        if blocker.elsewhere:
            said += f" ({blocker.elsewhere} on other workers)"
        return said
    if isinstance(blocker, SlotsBusy):
        return f"every slot busy {blocker.running}/{blocker.capacity}"
    raise TypeError(f"not a blocker: {blocker!r}")


def lines(why: Why | None) -> list[str]:
    """``why`` (``Scheduler.why``) in words, one line per blocker in order, then the jobs that
    come first, e.g. ``["type cap repack 3/3", "behind 4 jobs that come first (...)"]``;
    ``[FIRST]`` if neither; ``[]`` for ``None`` (the job is not pending there)."""
    if why is None:
        return []
    said = [line(blocker) for blocker in why.blockers]
    if why.ahead:
        jobs = "1 job that comes" if why.ahead == 1 else f"{why.ahead} jobs that come"
        said.append(f"behind {jobs} first (higher priority, or keys that have used less)")
    return said or [FIRST]


def waits_for(reason: BlockReason | None, why: Why | None) -> str:
    """What a job with no expected start waits for (``ExpectedStart.waits_for``: ``reason``),
    in the words of its blocker of that reason in ``why``, else the reason's name; ``""`` for
    ``None`` (it has an expected start)."""
    if reason is None:
        return ""
    blockers = () if why is None else why.blockers
    return next((line(b) for b in blockers if b.reason is reason), reason.value)
