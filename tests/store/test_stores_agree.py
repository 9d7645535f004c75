"""The in-memory store and the Redis store answer every sequence of operations alike.

A Hypothesis state machine drives both with the same random admissions, ends (with right and
stale tokens, learning or not, final or given back unstarted), registrations (with and without
a keep list) and heartbeats, from two workers, and compares every answer: verdicts, tokens,
estimates, accumulated costs, counts, conflict holds, how many jobs each worker has. The
example-based contract suite (test_contract.py) pins the rules; this looks for any sequence
on which the two implementations part ways. Time plays no part here (no TTLs, a lease far
longer than a run), since the two stores read different clocks.
"""

from __future__ import annotations

import math
import uuid

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from shared_redis import REDIS_URL, clean
from test_contract import ask

from celery_fair.core import CostLifecycle
from celery_fair.store import Done, MemoryStore, RedisStore, Running, conflict_field
from celery_fair.store.wire import unpack_token

NEVER = CostLifecycle.never()
WORKERS = ("w1", "w2")
KEYS = ("a", "b", "c", "s/x", "s/y", "t/x")
TENANTS = ("a", "b", "c", "s", "t")  # two-level keys: a key's tenant is the text before "/"
JOB_IDS = ("linux", "git", None)
# Rates (key's and tenant's): slow enough that no refill shows within the float tolerance
# between the two stores' clocks, so buckets are spent and stay spent; as the engine does,
# each name is always asked with the same terms: (rate, burst, per cost).
SLOW = 1e-12
KEY_RATES = {"b": (SLOW, 2.0, False), "s/y": (SLOW, 1.0, False), "t/x": (SLOW, 4.0, True)}
TENANT_RATES = {"s": (SLOW, 3.0, False), "c": (SLOW, 5.0, True)}
TYPES = {  # type: (priority, type cap)
    "clone": (8, 2),
    "pull": (4, None),
    "bg": (2, 1),
}


def same(x: object, y: object) -> bool:
    """Equal, floats within a relative 1e-9 (Redis keeps them as text)."""
    if isinstance(x, float) or isinstance(y, float):
        return x is not None and y is not None and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return len(x) == len(y) and all(same(a, b) for a, b in zip(x, y, strict=True))
    return x == y


def tenant_of(key: str) -> str:
    return key.split("/", 1)[0]


class BothStores(RuleBasedStateMachine):
    lifecycle = NEVER
    two_level = False  # every ask names its key's tenant (as with a key separator), or none

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"test-agree-{uuid.uuid4().hex[:10]}"
        self.client = redis.Redis.from_url(REDIS_URL)
        options = {"alpha": 0.5, "lifecycle": self.lifecycle, "lease": 1e6, "dedupe": 1e6}
        self.redis = RedisStore(redis.Redis.from_url(REDIS_URL), self.prefix, **options)
        # Tokens start above a store's creation time (store/wire.py): the Redis store is
        # created first, and the memory store's tokens start where its do.
        self.redis.finish("w0", [])
        high = self.client.hget(f"{{{self.prefix}}}:meta", "token_high")
        self.base = unpack_token(high, 0)
        self.memory = MemoryStore(**options, token_base=self.base)
        self.serial = 0
        self.running: dict[str, tuple[str, int, Running]] = {}  # uid -> worker, token, record
        self.ended: list[tuple[str, str, int]] = []  # (worker, uid, token) of jobs that ended
        self.refused: list[tuple[str, object]] = []  # (worker, ask) of refused urgent jobs

    def teardown(self) -> None:
        self.redis.close()
        clean(self.client, self.prefix)
        self.client.close()

    def both(self, op: str, *args: object, **kwargs: object) -> object:
        mine = getattr(self.memory, op)(*args, **kwargs)
        theirs = getattr(self.redis, op)(*args, **kwargs)
        return mine, theirs

    @rule(
        worker=st.sampled_from(WORKERS),
        jobs=st.lists(
            st.tuples(
                st.sampled_from(sorted(TYPES)),
                st.sampled_from(JOB_IDS),
                st.sampled_from(KEYS),
                st.none() | st.just(0.0) | st.floats(0.1, 50.0),
                st.none() | st.integers(1, 3),
                st.booleans(),  # urgent: claims a full tier or type cap
                st.sampled_from([1.0, 2.0]),  # its tenant's weight (with two levels)
                st.none() | st.integers(1, 2),  # its tenant's cap
            ),
            min_size=1,
            max_size=4,
        ),
        ends=st.integers(0, 3),
        watched=st.lists(st.sampled_from(["linux", "git", "redis"]), max_size=2),
    )
    def admit(self, worker, jobs, ends, watched):
        asks = []
        for jtype, job_id, key, cost, tier_cap, urgent, tweight, tcap in jobs:
            self.serial += 1
            priority, type_cap = TYPES[jtype]
            tenant = tenant_of(key) if self.two_level else None
            rate, burst, per_cost = KEY_RATES.get(key, (None, 1.0, False))
            trate, tburst, tper_cost = TENANT_RATES.get(tenant or "", (None, 1.0, False))
            asks.append(
                ask(f"j{self.serial}", key, type=jtype, priority=priority, tier_cap=tier_cap,
                    type_cap=type_cap, job_id=job_id, cost=cost, default_cost=2.0,
                    claim=1e6 if urgent else None, tenant=tenant, tenant_weight=tweight,
                    tenant_cap=None if tenant is None else tcap, rate=rate, burst=burst,
                    per_cost=per_cost, tenant_rate=trate, tenant_burst=tburst,
                    tenant_per_cost=tper_cost)
            )  # fmt: skip
        self._admit(worker, asks, ends, watched)

    @precondition(lambda self: self.refused)
    @rule(data=st.data(), ends=st.integers(0, 3))
    def ask_again(self, data, ends):
        """A refused urgent job is asked for again by its worker, as the engine does."""
        worker, a = self.refused.pop(data.draw(st.integers(0, len(self.refused) - 1)))
        self._admit(worker, [a], ends, [])

    def _admit(self, worker, asks, ends, watched):
        done = self._ends(worker, ends)
        watch = [conflict_field("git", w) for w in watched]
        mine, theirs = self.both("admit", worker, asks, done, watch)
        assert same(mine.finished, theirs.finished), (mine.finished, theirs.finished)
        assert same(mine.grants, theirs.grants), (mine.grants, theirs.grants)
        assert mine.held == theirs.held
        assert mine.workers == theirs.workers
        assert same(mine.tiers, theirs.tiers)
        assert same(mine.types, theirs.types)
        assert mine.keys == theirs.keys
        assert mine.tenants == theirs.tenants
        for a, grant in zip(asks, mine.grants, strict=True):
            if a.claim is not None and not grant.token:
                self.refused.append((worker, a))
            if grant.token:
                assert grant.estimate is not None
                record = Running(a.uid, grant.token, a.type, a.priority, a.conflict,
                                 a.estimate_key, a.fairness_key, grant.estimate, 2.0, a.tenant,
                                 grant.estimate / a.tenant_weight)  # fmt: skip
                self.running[a.uid] = (worker, grant.token, record)

    @rule(worker=st.sampled_from(WORKERS), ends=st.integers(1, 3))
    def finish(self, worker, ends):
        done = self._ends(worker, ends)
        mine, theirs = self.both("finish", worker, done)
        assert same(mine, theirs), (mine, theirs)

    @precondition(lambda self: self.running or self.ended)
    @rule(
        worker=st.sampled_from(WORKERS),
        forget=st.integers(0, 2),
        keep=st.booleans(),
        data=st.data(),
    )
    def register(self, worker, forget, keep, data):
        # The worker lists what it runs, less ``forget`` of its jobs (for a keep list: jobs it
        # no longer has), plus a job it runs that no store has heard of.
        ours = sorted(uid for uid, (w, _, _) in self.running.items() if w == worker)
        dropped = set(ours[:forget]) if keep else set()
        listed = [self.running[uid][2] for uid in ours if uid not in dropped]
        self.serial += 1
        key = data.draw(st.sampled_from(KEYS))
        tenant = tenant_of(key) if self.two_level else None
        fresh = Running(f"r{self.serial}", self.base + 10_000 + self.serial, "pull", 4, "",
                        "pull/", key, 1.0, 2.0, tenant, 0.0 if tenant is None else 0.5)  # fmt: skip
        listed.append(fresh)
        kept = [uid for w, uid, _ in self.ended if w == worker] if keep else None
        mine, theirs = self.both("register", worker, listed, kept)
        assert mine == theirs, (mine, theirs)
        self.running[fresh.uid] = (worker, fresh.token, fresh)
        for uid in dropped:
            del self.running[uid]

    @rule(worker=st.sampled_from(WORKERS))
    def heartbeat(self, worker):
        conflicts = sorted({r.conflict for _, _, r in self.running.values() if r.conflict})
        mine, theirs = self.both("heartbeat", worker, conflicts, list(KEYS), -1, list(TENANTS))
        assert mine.mine == theirs.mine
        assert mine.reclaimed == theirs.reclaimed == 0
        assert same(mine.tiers, theirs.tiers)
        assert same(mine.types, theirs.types)
        assert mine.held == theirs.held
        assert same(mine.accumulated, theirs.accumulated), (mine.accumulated, theirs.accumulated)
        assert mine.keys == theirs.keys
        assert same(mine.tenant_accumulated, theirs.tenant_accumulated), (
            mine.tenant_accumulated,
            theirs.tenant_accumulated,
        )
        assert mine.tenants == theirs.tenants
        assert mine.workers == theirs.workers

    @invariant()
    def same_estimates_and_costs(self):
        for key in KEYS:
            assert same(self.memory.accumulated_cost(key), self.redis.accumulated_cost(key))
        for jtype in TYPES:
            for job_id in JOB_IDS:
                assert same(
                    self.memory.estimate(jtype, job_id, -1.0),
                    self.redis.estimate(jtype, job_id, -1.0),
                )

    def _ends(self, worker: str, n: int) -> list[Done]:
        """Up to ``n`` ends of this worker's running jobs, in several ways; sometimes a stale
        token, or the end of a job that ended before."""
        done = []
        ours = sorted(uid for uid, (w, _, _) in self.running.items() if w == worker)
        for i, uid in enumerate(ours[:n]):
            _, token, _ = self.running[uid]
            how = (self.serial + i) % 5
            elapsed = (None, 0.0, 1.5, 2.5, 42.0)[how]
            stale = how == 3 and i == 0  # the store still counts it: it ends for real later
            done.append(Done(uid, token + 1 if stale else token, elapsed, final=how == 1,
                             unstarted=how == 2))  # fmt: skip
            if not stale:
                del self.running[uid]
                self.ended.append((worker, uid, token))
        previous = [e for e in self.ended if e[0] == worker][:1]
        for _, uid, token in previous:
            done.append(Done(uid, token, 1.0))  # a second end of the same job: stale now
        return done


TestStoresAgree = BothStores.TestCase
TestStoresAgree.settings = settings(stateful_step_count=30, deadline=None)


class BothStoresTwoLevels(BothStores):
    """The same with two-level keys (each ask names its key's tenant, as with a key
    separator) and ``advance_idle``: a key or tenant that runs nothing starts from the least
    cost of those that run (a key, of its tenant's keys)."""

    two_level = True
    lifecycle = CostLifecycle(cost_ttl=None, estimate_ttl=None, advance_idle=True)


TestStoresAgreeTwoLevels = BothStoresTwoLevels.TestCase
TestStoresAgreeTwoLevels.settings = settings(stateful_step_count=30, deadline=None)


@pytest.fixture(autouse=True)
def _redis_up():
    with redis.Redis.from_url(REDIS_URL) as client:
        client.ping()  # a missing Redis fails the test; it is never skipped
