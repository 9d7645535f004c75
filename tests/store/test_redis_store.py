"""What only the Redis store has: schema, scripts by SHA, restarts, outages. (Its equality with
the in-memory store on random operations: test_stores_agree.py.)"""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from harness import wait_until
from redis.crc import key_slot
from shared_redis import REDIS_URL, clean
from test_contract import ask

from celery_fair.core import CostLifecycle
from celery_fair.errors import ConfigurationError, StoreUnavailable
from celery_fair.store import (
    SCHEMA,
    Done,
    RedisStore,
    Running,
    Verdict,
    conflict_field,
    queued_member,
)
from celery_fair.store.base import rate_after, service_rate
from celery_fair.store.redis import KEY_NAMES
from celery_fair.store.wire import TOKEN_LOW_BITS, first_lane_version, unpack_token

NEVER = CostLifecycle.never()


@pytest.fixture
def prefix(redis_client):
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    clean(redis_client, name)


def test_every_key_shares_one_hash_slot(redis_client, prefix):
    store = RedisStore(redis_client, prefix)
    assert len(store.keys) == len(KEY_NAMES)
    assert len({key_slot(key.encode()) for key in store.keys}) == 1


def test_an_unknown_schema_is_refused_loudly(redis_client, prefix):
    store = RedisStore(redis_client, prefix, lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    redis_client.hset(f"{{{prefix}}}:meta", "schema", "999")
    with pytest.raises(ConfigurationError, match="schema 999"):
        store.admit("w1", [ask("b")])


def test_a_store_of_an_older_schema_is_upgraded_in_place_once_no_live_worker_holds_it(
    redis_client, prefix
):
    # Given a store that learned costs and runs a job of w1, written by the previous schema,
    key = {name: f"{{{prefix}}}:{name}" for name in KEY_NAMES}
    old = RedisStore(redis_client, prefix, lifecycle=NEVER)
    [first] = old.admit("w1", [ask("a", "alice", job_id="linux")]).grants
    old.finish("w1", [Done("a", first.token, 4.0)])
    old.admit("w1", [ask("b", "bob", job_id="linux")])
    previous = str(int(SCHEMA) - 1)
    redis_client.hset(key["meta"], "schema", previous)
    new = RedisStore(redis_client, prefix, lifecycle=NEVER)
    # when a worker of this version starts while w1 still holds its lease, it is refused,
    # saying why and what to do, and the store is left as it was;
    with pytest.raises(ConfigurationError, match=f"1 worker\\(s\\) of schema {previous} hold"):
        new.check()
    assert redis_client.hget(key["meta"], "schema").decode() == previous
    assert redis_client.hexists(key["jobs"], "b")
    # once w1's lease has lapsed (it stopped, or died), the next start upgrades it in place:
    redis_client.zadd(key["workers"], {"w1": 1.0})
    new.check()
    assert redis_client.hget(key["meta"], "schema").decode() == SCHEMA
    # the old running state is gone (nobody lives to own it: what a reclaim would free),
    assert not redis_client.exists(key["jobs"], key["conflicts"], key["workers"], key["active"])
    # what it learned stays, and the key that ran goes idle, so its cost lapses as usual,
    assert new.accumulated_cost("alice") == 1.0
    assert new.estimate("clone", "linux", 1.0) != 1.0
    assert redis_client.zscore(key["seen"], "bob") is not None
    # and the conflict is free again.
    [grant] = new.admit("w2", [ask("c", "carol", job_id="linux")]).grants
    assert grant.verdict is Verdict.ADMITTED
    assert grant.token > first.token


def test_scripts_come_back_after_script_flush(redis_client, prefix):
    store = RedisStore(redis_client, prefix, lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    redis_client.script_flush()
    assert store.admit("w1", [ask("b")]).grants[0].verdict is Verdict.ADMITTED


def test_an_unreachable_redis_raises_store_unavailable():
    client = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    store = RedisStore(client, "nowhere")
    with pytest.raises(StoreUnavailable):
        store.admit("w1", [ask("a")])
    with pytest.raises(StoreUnavailable):
        store.accumulated_cost("k")


def test_tokens_keep_rising_after_the_store_comes_back_empty_though_no_worker_remembers(
    redis_client, prefix
):
    # Given tokens handed out (and a job running under the last one),
    old = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
    tokens = [g.token for g in old.admit("w1", [ask(f"a{i}") for i in range(3)]).grants]
    # when Redis loses everything and a worker that never saw the store calls first,
    clean(redis_client, prefix)
    fresh = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
    [b] = fresh.admit("w2", [ask("b")]).grants
    # then its token is above every earlier one (the fencing recipe accepts its write),
    assert b.verdict is Verdict.ADMITTED
    assert b.token > max(tokens)
    # and it fences like any token: the end with it applies, a stale one does not.
    assert not fresh.finish("w2", [Done("b", b.token - 1, None)])[0].applied
    assert fresh.finish("w2", [Done("b", b.token, None)])[0].applied


def test_a_caller_raises_the_tokens_above_the_highest_it_has_seen(redis_client, prefix):
    # Given a worker that has seen tokens later than any this store would hand out now (a
    # store restarted on a clock that went back, say),
    def client(seen=0):
        store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
        store.token_seen = seen
        return store

    [a] = client().admit("w1", [ask("a")]).grants
    seen = a.token + (10**6 << TOKEN_LOW_BITS) + 5
    # when it creates the store (here: the first call after Redis lost everything),
    clean(redis_client, prefix)
    [b] = client(seen).admit("w1", [ask("b")]).grants
    # and when it calls a store that exists,
    [c] = client(b.token + (1 << TOKEN_LOW_BITS)).admit("w1", [ask("c")]).grants
    # then tokens continue above it.
    assert b.token == seen + 1
    assert c.token == b.token + (1 << TOKEN_LOW_BITS) + 1
    # A token registered again raises them too.
    big = c.token + (7 << TOKEN_LOW_BITS)
    other = client()
    assert other.register("w2", [Running("z", big, "clone", 8, "", "5:clone", "k", 1.0, 1.0)])
    assert other.admit("w2", [ask("d")]).grants[0].token == big + 1


def test_the_low_half_of_a_token_carries_into_the_high_half(redis_client, prefix):
    store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
    store.admit("w1", [ask("a")])
    meta = f"{{{prefix}}}:meta"
    high = int(redis_client.hget(meta, "token_high"))
    redis_client.hset(meta, "token", (1 << TOKEN_LOW_BITS) - 2)
    tokens = [g.token for g in store.admit("w1", [ask(f"b{i}") for i in range(3)]).grants]
    assert tokens == [
        unpack_token(high, (1 << TOKEN_LOW_BITS) - 1),
        unpack_token(high + 1, 0),
        unpack_token(high + 1, 1),
    ]
    assert all(
        store.finish("w1", [Done(f"b{i}", t, None)])[0].applied for i, t in enumerate(tokens)
    )


def test_a_store_that_comes_back_empty_admits_nothing_until_workers_re_register(
    redis_client, prefix
):
    # Given two workers with running jobs,
    one = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lease=1.0, lifecycle=NEVER)
    two = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lease=1.0, lifecycle=NEVER)
    [a] = one.admit("w1", [ask("a", job_id="linux", type_cap=2)]).grants
    [b] = two.admit("w2", [ask("b", job_id="git", type_cap=2)]).grants
    before = one.epoch
    # when Redis loses everything (a restart without persistence),
    clean(redis_client, prefix)
    # then the first worker to call opens a recovery window: nothing is admitted,
    reply = one.admit("w1", [ask("c", job_id="other", type_cap=2)])
    assert reply.grants[0].verdict is Verdict.RECOVERING
    assert one.epoch != before
    # each worker notices the new epoch and registers what it runs,
    assert one.register("w1", [running(a, "linux")]).registered == 1
    assert two.admit("w2", [ask("d", type_cap=2)]).grants[0].verdict is Verdict.RECOVERING
    assert two.epoch != before
    assert two.register("w2", [running(b, "git")]).registered == 1
    # and once the window has passed, the counts are right again: the type cap of 2 is full.

    def admits():
        two.heartbeat("w2", [], [])  # live workers keep beating
        verdict = one.admit("w1", [ask("e", type_cap=2)]).grants[0].verdict
        return verdict if verdict is not Verdict.RECOVERING else None

    assert wait_until(admits, 10, "the recovery window to end") is Verdict.TYPE_CAP
    assert one.finish("w1", [Done("a", a.token, None)])[0].applied
    [e] = one.admit("w1", [ask("e", type_cap=2)]).grants
    assert e.verdict is Verdict.ADMITTED
    assert e.token > max(a.token, b.token)


def running(grant, job_id):
    return Running(
        grant.uid, grant.token, "clone", 8, conflict_field("git", job_id),
        f"5:clone={job_id}", "k", 1.0, 1.0,
    )  # fmt: skip


def test_an_estimate_in_use_is_noted_again_when_a_long_job_ends(redis_client, prefix):
    """The finish of a job trusts its admission's note that the estimate was used only while
    that note is younger than a sixteenth of the estimate TTL; a longer job notes it again."""
    ttl = 1.6  # notes are refreshed at most every 0.1 s
    store = RedisStore(
        redis_client, prefix, lifecycle=CostLifecycle(cost_ttl=None, estimate_ttl=ttl)
    )
    estseen = f"{{{prefix}}}:estseen"
    field = ask("x", job_id="linux").estimate_key
    try:
        [first] = store.admit("w", [ask("a", job_id="linux")]).grants
        store.finish("w", [Done("a", first.token, 2.0)])  # learned: the estimate now exists
        [long] = store.admit("w", [ask("b", job_id="linux")]).grants  # notes it as used
        noted = redis_client.zscore(estseen, field)
        assert noted is not None

        def later() -> bool | None:
            seconds, micros = redis_client.time()
            return seconds + micros / 1e6 > noted + ttl / 16 or None

        wait_until(later, 10, "a sixteenth of the estimate TTL to pass", every=0.02)
        store.finish("w", [Done("b", long.token, 3.0)])
        assert redis_client.zscore(estseen, field) > noted + ttl / 16
    finally:
        store.close()


def test_the_lua_registry_writes_entries_in_the_layout_python_names(redis_client, prefix):
    # queued.lua builds each tracked submission's entry itself; queued_member is the layout's
    # one definition in Python. They agree, for a plain key, a key with the separators, and a
    # key whose length in bytes is not its length in characters.
    store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix)
    for key, task_id in (("alice", "t1"), ("a|1:b", "t2"), ("ålice", "t3")):
        assert store.track(key, task_id).added
        at = redis_client.zscore(f"{{{prefix}}}:queued_by_time", task_id)
        entry = redis_client.hget(f"{{{prefix}}}:queued_entry", task_id).decode()
        assert entry == queued_member(key, at, task_id)
        assert redis_client.zscore(f"{{{prefix}}}:queued_by_key", entry) == 0
    assert len(store._queued_keys) == 5  # every key queued.lua touches, in the prefix's slot
    for name in store._queued_keys:
        assert key_slot(name.encode()) == key_slot(f"{{{prefix}}}:meta".encode())


def test_the_lua_keeps_a_keys_rate_of_ends_as_python_names_it(redis_client, prefix):
    # queued.lua keeps each key's record of ends and computes its rate itself; rate_after and
    # service_rate are the rule's one definition in Python. Fed the same ends, they agree.
    store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix)
    for i in range(6):
        assert store.track("alice", f"a{i}").added
    assert store.track("bob", "b0").added
    record = None

    def server_now():
        seconds, micros = redis_client.time()
        return seconds + micros / 1e6

    for ids in (["a0", "a1"], ["a2", "b0", "gone"]):
        before = server_now()
        store.untrack(ids)
        after = server_now()
        raw = redis_client.hget(f"{{{prefix}}}:queued_rate", "alice").decode()
        n, since, last = (float(v) for v in raw.split("|"))
        assert before <= last <= after
        record = rate_after(record, ids.count("a0") + ids.count("a1") + ids.count("a2"), last)
        assert (n, since, last) == pytest.approx(record, abs=1e-6)
    assert redis_client.hget(f"{{{prefix}}}:queued_rate", "bob").decode().startswith("1.0")
    # Not known until a second after the first end; then the Lua's rate is the Python one's.
    assert store.queued("a5").rate == 0.0

    def asked():
        at = server_now()
        rate = store.queued("a5").rate
        return rate and (at, rate)

    at, found = wait_until(asked, 10, "a second of ends", every=0.05)
    now = server_now()
    # (the Lua read the server's clock between at and now: the rate falls as time passes)
    assert service_rate(record, now) - 1e-6 <= found <= service_rate(record, at) + 1e-6
    assert 0 < found <= 2.0  # two ends after the first, a second or more since it


# -- the lane table (lua/lanes.lua; its contract in test_store_lanes.py) ------------------------


def test_a_lane_tables_versions_never_repeat_after_its_store_came_back_empty(redis_client, prefix):
    # Given a table that changed many times,
    store = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
    store.sweep_lanes("w1", 16, [], [])
    seen = {store.lanes(-1).version}
    for i in range(50):
        store.ask_lane(f"k{i}")
        seen.add(store.lanes(-1).version)
    assert len(seen) == 51
    # when Redis loses everything, the new table's versions start above every old one
    # (producers compare versions for inequality: an old one would look current).
    clean(redis_client, prefix)
    fresh = store.lanes(max(seen))
    assert fresh is not None
    assert fresh.lanes == {}
    assert fresh.version > max(seen)
    assert fresh.version >= first_lane_version(time.time() - 1)


def test_a_lane_call_creates_no_store_so_a_worker_still_opens_the_recovery_window(
    redis_client, prefix
):
    # Given a worker running a job,
    worker = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lease=1.0, lifecycle=NEVER)
    worker.admit("w1", [ask("a")])
    before = worker.epoch
    # when Redis loses everything and lanes are the first calls to reach it (a producer's,
    # the worker's own sweep),
    clean(redis_client, prefix)
    producer = RedisStore(redis.Redis.from_url(REDIS_URL), prefix, lifecycle=NEVER)
    assert producer.lanes(-1) is not None
    worker.sweep_lanes("w1", 4, [], [])
    # then no store was created (no epoch without its recovery window), the worker remembers
    # the epoch it knew,
    assert not redis_client.exists(f"{{{prefix}}}:meta")
    assert worker.epoch == before
    # and its next admission opens the recovery window as it would have.
    reply = worker.admit("w1", [ask("b")])
    assert reply.grants[0].verdict is Verdict.RECOVERING
    assert worker.epoch != before


def test_a_lane_call_refuses_a_store_of_another_schema(redis_client, prefix):
    store = RedisStore(redis_client, prefix, lifecycle=NEVER)
    store.check()
    redis_client.hset(f"{{{prefix}}}:meta", "schema", "999")
    with pytest.raises(ConfigurationError, match=r"schema 999.*no lanes"):
        store.lanes(-1)
    assert not redis_client.exists(f"{{{prefix}}}:lanes")


def test_the_lanes_hash_holds_the_fields_docs_store_md_names(redis_client, prefix):
    store = RedisStore(redis_client, prefix, lifecycle=NEVER, lane_seconds=0.001)
    store.sweep_lanes("w|1", 2, [], [])
    assert store.ask_lane("a|b:c") == 0
    assert store.ask_lane("d") == 1

    def d_left() -> bool:  # its lease lapsed and its lane was found empty twice in a row
        store.sweep_lanes("w|1", 2, [1], [1])
        return "d" not in store.lanes(-1).lanes

    wait_until(d_left, 5, "d to leave its lane")
    fields = {
        f.decode(): v.decode() for f, v in redis_client.hgetall(f"{{{prefix}}}:lanes").items()
    }
    assert set(fields) == {"k:a|b:c", "k:d", "n:0", "n:1", "e:1", "w:w|1", "size", "version"}
    lane, renewed, leaving = fields["k:a|b:c"].split("|")
    assert (lane, leaving) == ("0", "")
    assert float(renewed) > time.time() - 60
    lane, _, leaving = fields["k:d"].split("|")
    assert lane == "1"
    assert float(leaving) > time.time() - 60
    assert (fields["n:0"], fields["n:1"]) == ("1", "1")  # a leaving key still owns its lane
    assert int(fields["e:1"]) >= 2
    assert (fields["w:w|1"], fields["size"]) == ("2", "2")


def test_the_lua_bucket_rule_computes_bit_for_bit_what_the_python_one_does(redis_client, prefix):
    # One rule in two languages (core/rates.py, lua/common.lua's bucket_level): given the same
    # stored level and time, both give the same level, for a bucket refilled, capped, in debt.
    import random

    from celery_fair.core.rates import level_at
    from celery_fair.store.redis import _source
    from celery_fair.store.wire import HEAD

    store = RedisStore(redis_client, prefix, lifecycle=NEVER)
    rates = store._key("rates")
    script = redis_client.register_script(
        _source("admit").split("local now = now_s()")[0]
        + "\nreturn fmt(bucket_level(RATES, ARGV[#ARGV - 3], tonumber(ARGV[#ARGV - 2]),"
        + " tonumber(ARGV[#ARGV - 1]), tonumber(ARGV[#ARGV])))"
    )
    head = [""] * len(HEAD)
    rng = random.Random(3)
    for i in range(200):
        level = rng.choice([rng.uniform(-50, 5), 0.0, 1.0, 2.5])
        stamp = rng.uniform(1.7e9, 1.8e9)
        now = stamp + rng.choice([0.0, -1.0, rng.uniform(0, 0.001), rng.uniform(0, 100)])
        rate, burst = rng.uniform(0.001, 50), rng.choice([1.0, 2.0, rng.uniform(1, 20)])
        redis_client.hset(rates, f"k{i}", f"{level!r}|{stamp!r}")
        got = script(keys=store.keys, args=[*head, f"k{i}", repr(rate), repr(burst), repr(now)])
        assert float(got) == level_at(level, stamp, now, rate, burst), (level, stamp, now)


def test_calls_from_several_threads_at_once_each_get_their_own_reply(redis_client, prefix):
    # A worker calls its store from its loop and from its lane watch's thread (green threads
    # under eventlet), over one connection: without one call at a time on it, a thread read
    # another's reply (eventlet: "Second simultaneous read on fileno"; threads: a reply of
    # the wrong shape, taken for a store outage).
    import threading

    store = RedisStore(redis_client, prefix, lifecycle=NEVER)
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(n: int) -> None:
        try:
            start.wait()
            for i in range(150):
                uid = f"w{n}-{i}"
                if i % 2:
                    view = store.heartbeat(f"w{n}", [], [])
                    assert view.epoch == store.epoch
                    continue
                [grant] = store.admit(f"w{n}", [ask(uid, f"k{n}")]).grants
                assert grant.uid == uid
                assert grant.verdict is Verdict.ADMITTED, grant
                store.finish(f"w{n}", [Done(uid, grant.token, 0.01)])
        except BaseException as exc:  # reported below, with the thread's own failure
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
