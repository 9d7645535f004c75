"""The engine: one worker's scheduling core and the fleet's shared store, composed.

No Celery here: the gate, the simulator and the tests drive the same code.

How it works
------------
The core orders this worker's pending jobs and proposes admissions as if it were alone, but
with the fleet's view folded in: jobs that other workers run count against tier and type caps,
conflicts that other workers hold park their waiters here, and accumulated costs and estimates
are the fleet's. The engine sends the proposals to the store in one call, together with the
jobs that finished since the last call; the store confirms or refuses each one atomically for
the whole fleet. A refused admission is reverted in the core, and the refusal teaches the core
what blocked it, so the job is not proposed again until that changes.

At most one call is in flight. Whatever happens meanwhile (jobs finishing, messages arriving)
rides on the next call, so under load one call carries many events (group commit), and the
store's answer always describes a state that the core has not moved past.

The glue drives it with two calls: ``decide()`` returns the jobs to start, the copies to drop,
and the store call to make now (if any); ``apply(call, result)`` feeds back that call's reply or
the exception it raised. Who makes the call (inline, or on a thread) is the glue's business:
``Call.execute(store)`` touches nothing but the store. Each kind of call is a type of its own
(``calls.py``: admit, beat, register), which knows how it is made and how its reply, or its
failure, is taken in (``replies.py``: how a reply becomes a decision). ``driver.py`` is the
one loop over the two (decide, make the call, apply), which ``run_inline``, the slot
scheduler's thread and the worker's store link share.

Modes
-----
``alone``: no store; the core is the authority (a single worker).
``shared``: the store confirms every admission.
``hold`` and ``local``: the store is unreachable. ``hold`` admits nothing new; ``local`` admits on
this worker's own share of each cap (``ceil(cap / live workers)``, the number of live workers
as the store last reported it), never a job with a conflict (exclusion needs the store). Either
way the engine probes the store with backoff, and when it answers, re-registers the jobs it
runs that the store does not know (after a restart that lost them, or admitted in ``local``
mode) before admitting anything. ``modes.py`` holds the mode and what the engine owes the
store (register, reconcile, policies) as one transition table; ``outage.py`` the backoff and
local mode's shares; ``fleet.py`` the fleet as the store last reported it, this worker's own
share taken out.

Leases
------
The store admits a job under this worker's lease; if the lease lapses (a pause past it: SIGSTOP,
a long GC, a VM pause), the store releases the job and may admit a conflicting one elsewhere.
A job already running cannot be called back (its side effects are fenced by its token), but a
job admitted and not yet started can: ``vet`` gives it back unless the lease has surely held
since its admission, that is, unless every successful store call since then was sent less than
``lease_held_for(lease)`` after the one before it, the last one included. ``reserved.py`` holds
that rule and ``reconsider``'s, for the jobs admitted and not yet started.
"""

from .calls import AdmitCall, BeatCall, Call, Decision, RegisterCall
from .driver import LATER, Driver
from .engine import Engine
from .modes import Mode
from .outage import OUTAGE_POLICIES
from .reserved import Vetted

__all__ = [
    "LATER",
    "OUTAGE_POLICIES",
    "AdmitCall",
    "BeatCall",
    "Call",
    "Decision",
    "Driver",
    "Engine",
    "Mode",
    "RegisterCall",
    "Vetted",
]
