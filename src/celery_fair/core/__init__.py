"""The scheduling core: pure rules, no I/O, time from an injected clock.

Theory of operation
-------------------
Jobs are ``(type, job_id)`` pairs submitted on behalf of a *fairness key* (who asked; ``""``
for background work). Each job type has a *priority*; all types of one priority form a *tier*.
The scheduler repeatedly admits the first *admissible* pending job in the order::

    (-priority, accumulated_cost[fairness_key], arrival, submission order)

A job is admissible when (1) fewer jobs run than the global capacity, (2) its tier runs fewer
jobs than the tier's cap (by default the priority value itself), (3) its type runs fewer than
its ``max_concurrency``, and (4) no running job has the same ``job_id`` in the same non-empty
conflict group. A blocked job never blocks the jobs behind it, including later jobs of its own
fairness key. Admitting a job charges its *estimate* to its key's accumulated cost, so the key
that has consumed the least goes next within a tier.

Estimates are learned per ``(type, job_id)`` as an exponential moving average of observed wall
time, ``alpha * elapsed + (1 - alpha) * previous``, starting from the type's ``default_cost``.
Idle keys' costs and unused estimates are forgotten after a TTL (``CostLifecycle``).

Structures and what they index
------------------------------
- ``Tier`` (one per priority, highest first) lists its ``Lane`` objects (one per type) and
  counts its running and pending jobs. A full tier or type is skipped as a whole in O(1).
- A lane's ``KeyedQueue`` is a lazy heap of *key queues* ordered by (accumulated cost, head
  arrival, head seq); each key queue holds that key's jobs by (arrival, seq), in a FIFO deque
  with a side heap for the rare job that arrives out of order.
- A ``Conflict`` (group, job_id) exists while a job holds it or jobs wait for it. A job whose
  conflict is held is *parked* in the conflict's keyed queue for its lane, on submit or when it
  first reaches the front. A lane's queue also keeps a lazy heap of *waiters*: for each conflict
  that is free, the place of its first waiter in that lane, the only one of them that can be
  admitted next; a charge moves none of it, a stale entry is fixed when it comes to the top.
- ``Accounts`` holds each key's accumulated cost and counts; ``Estimates`` the learned costs.
- With two-level keys (``SchedulerConfig.key_separator``), a lane's queue is a
  ``tenants.TenantedQueue``: a lazy heap of *tenant queues* by the tenant's rank and cost,
  each a ``KeyedQueue`` of that tenant's key queues; tenants have a ``KeyState`` and
  ``Accounts`` of their own, charged at each admission beside the key.

A fleet
-------
When workers share a store, each core also hears what the others do (``celery_fair.engine``
feeds it): jobs running elsewhere lower the effective cap of their tier and lane
(``set_running_elsewhere``), a conflict held elsewhere gets the ``ELSEWHERE`` holder and parks
its waiters (``hold_elsewhere``/``release_elsewhere``), costs and estimates become the fleet's
(``set_accumulated``/``set_estimate``), and an admission the store refused is undone
(``revert``). A cost that goes down moves only its own key queues (``KeyState.queues``).

Complexity
----------
submit O(log n); cancel O(1); an admission O(T + L + (1 + k) log n)
amortised, where T is the number of tiers, L the lanes of the chosen tier and k the held
conflicts its key has jobs waiting on, independent of how many jobs are blocked; completion
O(log n) plus one waiter's entry per lane of a released conflict; snapshot O(n log n); status
of one job O(n).

Modules
-------
``types`` (values in and out), ``clock``, ``jobs`` (the records: job, tier, lane, conflict),
``policy`` (the dispatch rule), ``fairqueue`` (the pending index), ``tenants`` (its second
level, for two-level keys), ``costs`` (estimates and accounts), ``aging``, ``allocation``,
``inspect`` (status, expected start, blockers, snapshot: values only, and the blockers as
plain data), ``reserve``, ``state`` (the structures, and the moves every operation is made of),
``shared`` (what a shared store says of the fleet), and ``scheduler``, the façade over them.

Rules for this package
----------------------
1. Every rule that decides admission lives in ``policy.py`` (``select``, ``blocked_by``,
   ``comes_before``, ``key_holds``, ``goes_before``); the structures in ``fairqueue.py`` only
   keep the order and the wait lists, and take the rule from ``policy.py``; both read the
   records of ``jobs.py``, which imports neither.
2. Nothing here imports outside the standard library or reads time except through ``Clock``
   (``clock.py`` is the one module that touches ``time``).
3. Expected outcomes are return values; exceptions mean the caller broke the contract.
4. Inspection answers in values (``inspect.Why`` and its blockers), never in words: English
   is written at the edge, from those values, by ``celery_fair.words`` (layer 3).
"""

from __future__ import annotations

from .clock import Clock, MonotonicClock, SimClock, WallClock
from .reserve import ReserveDepth
from .scheduler import Scheduler
from .types import (
    Admission,
    Aging,
    BlockReason,
    CancelOutcome,
    CostLifecycle,
    JobState,
    JobType,
    JobView,
    KeyPolicies,
    KeyPolicy,
    PriorityOutcome,
    Release,
    SchedulerConfig,
    Snapshot,
    key_label,
    tier_cap,
)

__all__ = [
    "Admission",
    "Aging",
    "BlockReason",
    "CancelOutcome",
    "Clock",
    "CostLifecycle",
    "JobState",
    "JobType",
    "JobView",
    "KeyPolicies",
    "KeyPolicy",
    "MonotonicClock",
    "PriorityOutcome",
    "Release",
    "ReserveDepth",
    "Scheduler",
    "SchedulerConfig",
    "SimClock",
    "Snapshot",
    "WallClock",
    "key_label",
    "tier_cap",
]
