"""The Redis store: the fleet's shared state, one Lua script per atomic decision.

Every key of one prefix carries the same hash tag (``{prefix}``), so every script touches one
slot and runs unchanged on Redis Cluster, Sentinel and Valkey. Scripts are loaded once and
called by SHA; redis-py loads them again when the server answers NOSCRIPT (after a restart or
SCRIPT FLUSH). Time is the Redis server's clock (``TIME``), so worker clocks may drift freely.
Opening the client, the hiredis connection and which errors mean "unavailable" are
connection.py's; ``Wire`` and ``script_reply_error`` are re-exported here.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Collection, Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any, NamedTuple

from ..core.lanes import DEFAULT_LANE_SECONDS, LaneMap
from ..core.types import CostLifecycle
from ..errors import ConfigurationError, StoreUnavailable
from .base import (
    SCHEMA,
    Ask,
    Done,
    Finished,
    Grant,
    Holder,
    PolicyChange,
    Queued,
    QueuedCount,
    Registered,
    Reply,
    Running,
    Submission,
    Tracked,
    Verdict,
    View,
    check_lane_seconds,
    estimate_field,
    lane_sweep,
    parse_queued_member,
    submission_field,
)
from .connection import Wire, client_from_url, script_reply_error, unavailable_errors
from .wire import (
    FINISH_APPLIED,
    HEAD,
    LANE_ASK,
    LANE_READ,
    LANE_RENEW,
    LANE_SWEEP,
    lua_constants,
    pack_token,
    unpack_token,
)

if TYPE_CHECKING:
    import redis as redis_py

__all__ = ["KEY_NAMES", "RedisStore", "Request", "Wire", "script_reply_error"]

KEY_NAMES = (
    "meta",
    "tiers",
    "types",
    "conflicts",
    "jobs",
    "workers",
    "acc",
    "seen",
    "active",
    "est",
    "estseen",
    "minacc",
    "done",
    "policies",
    "claims",
    "lanes",
    "rates",
    "type_rates",
    "tacc",
    "tseen",
    "tactive",
    "tminacc",
    "tkmin",
    "trates",
)
"""The store's keys, in the order the scripts receive them (see ``lua/common.lua``)."""

_SCRIPTS = ("admit", "complete", "heartbeat", "register", "inspect", "policies", "open", "lanes")
"""The scheduling scripts: common.lua and the generated argument names come first in each."""

_STANDALONE = ("queued", "holder", "submission")
"""Scripts on keys of their own, with arguments of their own (each documents its ARGV)."""


def _as_text(value: object) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)


class Request(NamedTuple):
    """One script call, packed: what to send, and how to read the reply."""

    script: str
    args: list[str]
    parse: Callable[[Any], Any]


#: Each verdict by its reply bytes (an Enum lookup by value costs more than a dict's).
_VERDICTS: dict[bytes, Verdict] = {v.value.encode(): v for v in Verdict}


_TOKEN_SEEN = HEAD.index("token_seen")


@functools.cache
def _source(name: str) -> str:
    lua = resources.files(__package__) / "lua"
    common = (lua / "common.lua").read_text()
    body = common + "\n" + (lua / f"{name}.lua").read_text()
    return lua_constants(body) + body  # only the names it uses: at most 200 locals


def _opt(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _pack_done(args: list[str], done: Iterable[Done]) -> None:
    done = list(done)
    args.append(str(len(done)))
    for d in done:
        how = "u" if d.unstarted else "1" if d.final else "0"
        args += (d.uid, pack_token(d.token), _opt(d.elapsed), how)


_APPLIED = FINISH_APPLIED.encode()


def _finished(done: Iterable[Done], results: list[Any]) -> list[Finished]:
    return [
        Finished(d.uid, status == _APPLIED, float(value) if status == _APPLIED else None)
        for d, (status, value) in zip(done, results, strict=True)
    ]


def _pairs(flat: list[Any], key: type) -> dict[Any, int]:
    return {key(flat[i].decode()): int(flat[i + 1]) for i in range(0, len(flat), 2)}


class RedisStore:
    """Shared state in Redis under ``prefix``.

    Args:
        client: A redis-py client (``Redis`` or ``RedisCluster``).
        prefix: Namespace of this scheduler's keys; workers that share it share caps,
            conflicts and costs.
        alpha: The estimate's smoothing factor.
        lifecycle: TTLs, periodic reset and idle advancing, as in the core.
        lease: Seconds a worker's jobs stay counted after its last call; a worker calls at
            least every ``lease / 3``.
        dedupe: Seconds the store remembers the uid of a job that finished for good
            (``Done.final``), answering ``DONE`` to a late copy of its message; 0 for never.
        lane_seconds: ``fair_lane_seconds``: how long a heavy key's lane assignment lasts
            without renewal (``Store.sweep_lanes``).
    """

    def __init__(
        self,
        client: redis_py.Redis | redis_py.RedisCluster,
        prefix: str = "celery_fair",
        *,
        alpha: float = 0.3,
        lifecycle: CostLifecycle | None = None,
        lease: float = 30.0,
        dedupe: float = 300.0,
        lane_seconds: float = DEFAULT_LANE_SECONDS,
    ) -> None:
        if not prefix or "{" in prefix or "}" in prefix:
            raise ConfigurationError(
                f"fair_store_prefix must be non-empty and without braces, got {prefix!r}"
            )
        if not (isinstance(lease, (int, float)) and lease > 0):
            raise ConfigurationError(f"fair_lease_seconds must be a positive number, got {lease!r}")
        self.client = client
        self.prefix = prefix
        self.alpha = alpha
        self.lifecycle = lifecycle or CostLifecycle()
        self.lease = float(lease)
        self.dedupe = float(dedupe)
        self.lane_seconds = check_lane_seconds(lane_seconds)
        self.epoch = ""
        # token_seen: the highest fencing token this client has seen (admitted, or registered
        # again), sent with every call: a store that came back empty continues above it.
        self.token_seen = 0
        self._head_cache: tuple[str, str, list[str]] | None = None
        self.keys = [f"{{{prefix}}}:{name}" for name in KEY_NAMES]
        import redis as redis_lib

        # Plain Redis: scripts go over a hiredis wire; Redis Cluster: through redis-py, which
        # routes each call to the node that serves the prefix's hash slot.
        self._wire = Wire(client) if type(client) is redis_lib.Redis else None
        # One call at a time on the wire: a worker calls from its loop and from its lane
        # watch's thread (a green thread under eventlet or gevent, which would otherwise read
        # each other's replies). Uncontended, it costs well under a microsecond a call.
        self._wire_lock = threading.Lock()
        self._sources = {name: _source(name) for name in _SCRIPTS}
        self._scripts = {name: client.register_script(self._sources[name]) for name in _SCRIPTS}
        self._queued = client.register_script(
            (resources.files(__package__) / "lua" / f"{_STANDALONE[0]}.lua").read_text()
        )
        self._holder = client.register_script(
            (resources.files(__package__) / "lua" / f"{_STANDALONE[1]}.lua").read_text()
        )
        self._submission_script = client.register_script(
            (resources.files(__package__) / "lua" / f"{_STANDALONE[2]}.lua").read_text()
        )
        self._queued_keys = [
            f"{{{prefix}}}:{name}"
            for name in (
                "queued_by_key",
                "queued_by_time",
                "queued_entry",
                "queued_rate",
                "queued_refused",
            )
        ]

    @classmethod
    def from_url(
        cls, url: str, *, sentinel_kwargs: Mapping[str, Any] | None = None, **options: Any
    ) -> RedisStore:
        """A store on the Redis at ``url``.

        ``redis://``, ``rediss://`` and ``unix://`` name one server; ``redis+cluster://host:port``
        (or ``rediss+cluster://``) names any node of a Redis Cluster;
        ``sentinel://host:port/db;sentinel://host2:port?master_name=name`` names the Sentinels
        that know the current master of ``name`` (the form of Kombu's Sentinel broker URL);
        ``sentinel_kwargs`` are the options of the connections to the Sentinels themselves (a
        password of theirs, as in Kombu's transport option of that name); ``sentinel_username``
        and ``sentinel_password`` in the URL's query say the same.
        """
        return cls(client_from_url(url, sentinel_kwargs), **options)

    # -- operations ------------------------------------------------------------------------
    #
    # Each operation is a request (the script and its arguments) and the parsing of its reply,
    # so the same packing serves the blocking calls below and an event loop that sends the
    # request and reads the reply when it arrives (celery_fair.worker.link).

    def admit(
        self,
        worker: str,
        asks: list[Ask],
        done: list[Done] | None = None,
        watch: list[str] | None = None,
    ) -> Reply:
        """One round trip: release ``done``, admit what fits of ``asks``, read ``watch``."""
        result: Reply = self.run(self.admit_request(worker, asks, done, watch))
        return result

    def finish(self, worker: str, done: list[Done]) -> list[Finished]:
        """Release ``done`` in one round trip."""
        result: list[Finished] = self.run(self.finish_request(worker, done))
        return result

    def heartbeat(
        self,
        worker: str,
        conflicts: list[str],
        keys: list[str],
        policies: int = -1,
        tenants: list[str] | None = None,
    ) -> View:
        """Renew the lease, reclaim, read counts, conflicts and costs (of ``keys`` and
        ``tenants``): one round trip. With the runtime policies' version the caller has
        (``policies``), the reply carries the policies when they are another version."""
        result: View = self.run(self.heartbeat_request(worker, conflicts, keys, policies, tenants))
        return result

    def policies(self) -> tuple[int, str]:
        """The runtime policies' version (0: never set) and document (JSON, ``""`` if none)."""
        version, doc = self.client.hmget(self._key("policies"), ["version", "doc"])
        return int(version or 0), _as_text(doc)

    def claim_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> Submission | None:
        """One round trip (``lua/submission.lua``)."""
        found = self._submission_op("claim", fairness_key, idempotency_key, task_id, seconds)
        if not found:
            return None
        held, published = found
        return Submission(_as_text(held), bool(int(published)))

    def confirm_submission(
        self, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> bool:
        """One round trip (``lua/submission.lua``)."""
        return bool(self._submission_op("confirm", fairness_key, idempotency_key, task_id, seconds))

    def forget_submission(self, fairness_key: str, idempotency_key: str, task_id: str) -> None:
        """One round trip (``lua/submission.lua``)."""
        self._submission_op("forget", fairness_key, idempotency_key, task_id, 0.0)

    def _submission_op(
        self, op: str, fairness_key: str, idempotency_key: str, task_id: str, seconds: float
    ) -> Any:
        field = submission_field(fairness_key, idempotency_key)
        keys = [f"{{{self.prefix}}}:submitted:{field}", f"{{{self.prefix}}}:submitting:{field}"]
        args = [op, task_id, str(max(1, round(seconds * 1000)))]
        return self._read(lambda c: self._submission_script(keys=keys, args=args, client=c))

    def update_policies(self, change: PolicyChange) -> tuple[int, str]:
        """Replace the runtime policies' document by ``change(document)``'s, with the paused
        keys, types and tenants it names (``pk:<key>``, ``pt:<type>`` and ``pn:<tenant>``
        fields, which admit.lua
        refuses): read, change, then a compare-and-set on the version (policies.lua), tried
        again if another update came in between. The version goes up by one. Returns the new
        version and document."""
        while True:
            version, doc = self.policies()
            new, keys, types, tenants = change(doc)
            fields = [*(f"pk:{k}" for k in keys), *(f"pt:{t}" for t in types)]
            fields += [f"pn:{t}" for t in tenants]
            args = [*self._head("policies"), str(version), new, *fields]
            (done,) = self._call("policies", args)
            if done:
                return int(done), new

    def register(
        self, worker: str, jobs: list[Running], keep: list[str] | None = None
    ) -> Registered:
        """Put back the running jobs the store forgot (with ``keep``, also release what this
        worker does not have): one round trip."""
        result: Registered = self.run(self.register_request(worker, jobs, keep))
        return result

    def run(self, request: Request) -> Any:
        """Make ``request`` now, blocking until Redis answers."""
        return self.parse(request, self._call(request.script, request.args))

    def parse(self, request: Request, raw: Any) -> Any:
        """What ``request``'s reply means; every reply starts with the store's epoch. A lane
        call on a store that no worker has opened yet says ``""`` (lua/lanes.lua creates no
        store): the epoch remembered stays, so that this client's next scheduling call on a
        store that came back empty still opens its recovery window."""
        epoch = raw[0].decode()
        if epoch:
            self.epoch = epoch
        return request.parse(raw)

    def admit_request(
        self,
        worker: str,
        asks: list[Ask],
        done: list[Done] | None = None,
        watch: list[str] | None = None,
    ) -> Request:
        done = done or []
        watch = watch or []
        args = self._head(worker)
        _pack_done(args, done)
        args.append(str(len(asks)))
        for a in asks:
            args += (
                a.uid,
                a.type,
                str(a.priority),
                "" if a.tier_cap is None else str(a.tier_cap),
                "" if a.type_cap is None else str(a.type_cap),
                a.conflict,
                a.estimate_key,
                a.fairness_key,
                _opt(a.cost),
                repr(float(a.default_cost)),
                "" if a.key_cap is None else str(a.key_cap),
                repr(float(a.weight)),
                _opt(a.claim),
                _opt(a.rate),
                repr(float(a.burst)),
                "1" if a.per_cost else "0",
                _opt(a.type_rate),
                repr(float(a.type_burst)),
                "1" if a.type_per_cost else "0",
                a.tenant or "",
                "" if a.tenant is None else repr(float(a.tenant_weight)),
                "" if a.tenant_cap is None else str(a.tenant_cap),
                _opt(a.tenant_rate),
                repr(float(a.tenant_burst)),
                "1" if a.tenant_per_cost else "0",
            )
        args += watch

        def parse(raw: Any) -> Reply:
            _, _, finished, results, tiers, types, held, workers, keys, tenants = raw
            grants = []
            for a, row in zip(asks, results, strict=True):
                status, high, low, estimate, acc, tokens, type_tokens, tacc, ttokens = row
                verdict = _VERDICTS.get(status) or Verdict(status.decode())
                admitted = verdict is Verdict.ADMITTED
                token = unpack_token(high, low) if admitted else 0
                grants.append(
                    Grant(a.uid, verdict, token, float(estimate) if admitted else None,
                          float(acc), float(tokens) if tokens else None,
                          float(type_tokens) if type_tokens else None,
                          float(tacc) if tacc else None,
                          float(ttokens) if ttokens else None)
                )  # fmt: skip
                if token > self.token_seen:
                    self.token_seen = token
            return Reply(
                self.epoch,
                _finished(done, finished),
                grants,
                _pairs(tiers, int),
                _pairs(types, str),
                {c: bool(h) for c, h in zip(watch, held, strict=True)},
                int(workers),
                _pairs(keys, str),
                _pairs(tenants, str),
            )

        return Request("admit", args, parse)

    def finish_request(self, worker: str, done: list[Done]) -> Request:
        args = self._head(worker)
        _pack_done(args, done)
        return Request("complete", args, lambda raw: _finished(done, raw[2]))

    def heartbeat_request(
        self,
        worker: str,
        conflicts: list[str],
        keys: list[str],
        policies: int = -1,
        tenants: list[str] | None = None,
    ) -> Request:
        tenants = tenants or []
        args = self._head(worker)
        args.append(str(policies))
        args.append(str(len(conflicts)))
        args += conflicts
        args.append(str(len(keys)))
        args += keys
        args += tenants

        def parse(raw: Any) -> View:
            (_, now, mine, reclaimed, tiers, types, held, accs, workers, runs, version, doc,
             taccs, truns) = raw  # fmt: skip
            return View(
                self.epoch,
                float(now),
                int(mine),
                int(reclaimed),
                _pairs(tiers, int),
                _pairs(types, str),
                {c: bool(h) for c, h in zip(conflicts, held, strict=True)},
                {k: float(v) for k, v in zip(keys, accs, strict=True)},
                int(workers),
                {k: int(n) for k, n in zip(keys, runs, strict=True) if int(n)},
                int(version),
                _as_text(doc) or None,
                {t: float(v) for t, v in zip(tenants, taccs, strict=True)},
                {t: int(n) for t, n in zip(tenants, truns, strict=True) if int(n)},
            )

        return Request("heartbeat", args, parse)

    def register_request(
        self, worker: str, jobs: list[Running], keep: list[str] | None = None
    ) -> Request:
        args = self._head(worker)
        args.append(str(len(jobs)))
        for j in jobs:
            if j.token > self.token_seen:
                self.token_seen = j.token
            args += (
                j.uid,
                pack_token(j.token),
                j.type,
                str(j.priority),
                j.conflict,
                j.estimate_key,
                j.fairness_key,
                repr(float(j.estimate)),
                repr(float(j.default_cost)),
                j.tenant or "",
                "" if j.tenant is None else repr(float(j.tenant_charge)),
            )
        if keep is not None:
            args.append(str(len(keep)))
            args += keep
        return Request("register", args, lambda raw: Registered(int(raw[1]), int(raw[2])))

    # -- lanes (lua/lanes.lua; Store.lanes ... sweep_lanes state what each does) -------------

    def lanes(self, version: int) -> LaneMap | None:
        """One round trip: O(1) while unchanged, else O(assignments + lanes + workers)."""
        result: LaneMap | None = self.run(self.lanes_request(version))
        return result

    def ask_lane(self, fairness_key: str) -> int | None:
        """One round trip: O(1) for a key with a lane, O(agreed size) for a new one."""
        result: int | None = self.run(self.ask_lane_request(fairness_key))
        return result

    def renew_lanes(self, fairness_keys: Collection[str]) -> None:
        """One round trip, none for no keys: O(keys given)."""
        if fairness_keys:
            self.run(self.renew_lanes_request(fairness_keys))

    def sweep_lanes(
        self, worker: str, size: int, looked: Collection[int], empty: Collection[int]
    ) -> None:
        """One round trip: O(assignments + lanes + live workers)."""
        self.run(self.sweep_lanes_request(worker, size, looked, empty))

    def lanes_request(self, version: int) -> Request:
        args = [*self._head(""), LANE_READ, str(version)]

        def parse(raw: Any) -> LaneMap | None:
            _, current, routed, *size = raw
            if routed is None:
                return None
            lanes = {routed[i].decode(): int(routed[i + 1]) for i in range(0, len(routed), 2)}
            return LaneMap(int(current), lanes, int(size[0]))

        return Request("lanes", args, parse)

    def ask_lane_request(self, fairness_key: str) -> Request:
        args = [*self._head(""), LANE_ASK, fairness_key]
        return Request("lanes", args, lambda raw: None if raw[1] is None else int(raw[1]))

    def renew_lanes_request(self, fairness_keys: Collection[str]) -> Request:
        args = [*self._head(""), LANE_RENEW, *fairness_keys]
        return Request("lanes", args, lambda raw: None)

    def sweep_lanes_request(
        self, worker: str, size: int, looked: Collection[int], empty: Collection[int]
    ) -> Request:
        """Raises ``ValueError`` for a size or lane that is not an integer >= 0."""
        seen, found = lane_sweep(size, looked, empty)
        # after the operation: wire.py's SWEEP, then the lanes looked at, then the empty ones
        args = [*self._head(worker), LANE_SWEEP, str(size), repr(self.lane_seconds)]
        args += [str(len(seen)), *map(str, seen), *map(str, found)]
        return Request("lanes", args, lambda raw: None)

    def inspect(self) -> dict[str, Any]:
        """What the store holds now, read in one round trip that changes nothing: live workers
        (lease expiry, job count), running jobs, counts by tier and type, conflicts held, the
        accumulated costs of the keys that run, and how many costs, estimates and tombstones
        it keeps. Times are the Redis server's (``now`` says it). See ``celery-fair store``.
        ``queue_full`` counts the submits a limit refused since the store began (``QueueFull``,
        by scope: ``key``, ``total``), read in a second round trip; ``lanes``, in a third, the
        lanes the fleet agrees on (``size``) and the keys that have one now (``keys``). With
        two-level keys, ``tenants`` has each tenant with a running job, its running jobs and
        its accumulated cost.
        """
        import json

        state: dict[str, Any] = json.loads(self._call("inspect", self._head("")))
        state["token"] = unpack_token(*state["token"].split(":"))
        for job in state["jobs"] or ():
            job["token"] = unpack_token(*job["token"].split(":"))
        for name in ("workers", "jobs", "conflicts", "costs", "tiers", "types", "tenants"):
            if not state[name]:  # Lua's cjson writes an empty table as {}
                state[name] = [] if name in ("workers", "jobs") else {}
        refused = self._read(lambda c: c.hgetall(self._queued_keys[4]))
        state["queue_full"] = {_as_text(k): int(v) for k, v in refused.items()}
        # a third: the lane table (core/lanes.py); not on an unused prefix, where reading it
        # would write its first version
        lanes = self.lanes(-1) if state["schema"] is not None else None
        state["lanes"] = {
            "size": lanes.size if lanes is not None else 0,
            "keys": dict(lanes.lanes) if lanes is not None else {},
        }
        return state

    @property
    def released_channel(self) -> str:
        """The channel on which every script call that releases running jobs publishes how
        many (``lua/common.lua``), for callers waiting for a slot to ask again at once
        (``celery_fair.slot``). Under the prefix's hash tag, like the keys."""
        return f"{{{self.prefix}}}:released"

    def script(self, name: str) -> tuple[str, str]:
        """A script's SHA1 and its source, for clients that send it themselves."""
        return self._scripts[name].sha, self._sources[name]

    def check(self) -> None:
        """Fail now, not at the first decision, if the store cannot be opened: it holds a newer
        schema, or an older one that a live worker still uses. A store of an older schema
        that no live worker holds is upgraded in place (``open.lua``; docs/store.md). One
        round trip.

        Raises:
            ConfigurationError: The prefix holds a schema this version cannot open now.
            StoreUnavailable: Redis cannot be reached.
        """
        self._call("open", self._head(""))

    # -- inspection --------------------------------------------------------------------------

    def track(
        self,
        fairness_key: str,
        task_id: str,
        *,
        key_limit: int | None = None,
        total_limit: int | None = None,
        seconds: float = 86400.0,
    ) -> QueuedCount:
        """One round trip (``lua/queued.lua``)."""
        args = [
            "track",
            fairness_key,
            task_id,
            "" if key_limit is None else str(key_limit),
            "" if total_limit is None else str(total_limit),
            repr(float(seconds)),
        ]
        added, in_key, total, by = self._read(
            lambda c: self._queued(keys=self._queued_keys, args=args, client=c)
        )
        return QueuedCount(bool(added), int(in_key), int(total), _as_text(by))

    def untrack(self, task_ids: Collection[str], *, ended: bool = True) -> int:
        """One round trip (``lua/queued.lua``)."""
        if not task_ids:
            return 0
        args = ["untrack" if ended else "withdraw", *task_ids]
        n = self._read(lambda c: self._queued(keys=self._queued_keys, args=args, client=c))
        return int(n)

    def holder(self, conflict: str) -> Holder | None:
        """One round trip (``lua/holder.lua``), reading only."""
        keys = [self._key("conflicts"), self._key("jobs")]
        found = self._read(lambda c: self._holder(keys=keys, args=[conflict], client=c))
        if not found:
            return None
        uid, worker, held_for = (_as_text(v) for v in found)
        return Holder(uid, worker, float(held_for) if held_for else None)

    def queued(self, task_id: str) -> Queued | None:
        found = self._read(
            lambda c: self._queued(keys=self._queued_keys, args=["find", task_id], client=c)
        )
        if not found:
            return None
        key, at, place_in_key, in_key, place, total, rate = found
        return Queued(
            _as_text(key),
            float(at),
            int(place_in_key),
            int(in_key),
            int(place),
            int(total),
            float(rate),
        )

    def tracked(
        self, fairness_key: str | None = None, limit: int = 100
    ) -> tuple[list[Tracked], int]:
        """One round trip (``lua/queued.lua``, ``list``)."""
        which = ["all", ""] if fairness_key is None else ["key", fairness_key]
        found = self._read(
            lambda c: self._queued(
                keys=self._queued_keys, args=["list", *which, str(int(limit))], client=c
            )
        )
        return [parse_queued_member(_as_text(m)) for m in found[1:]], int(found[0])

    def estimate(self, type: str, job_id: str | None, default: float) -> float:
        value = self._read(lambda c: c.hget(self._key("est"), estimate_field(type, job_id)))
        return default if value is None else float(value)

    def accumulated_cost(self, fairness_key: str) -> float:
        value = self._read(lambda c: c.hget(self._key("acc"), fairness_key))
        return 0.0 if value is None else float(value)

    def close(self) -> None:
        if self._wire is not None:
            self._wire.close()
        self.client.close()

    # -- internals ---------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return self.keys[KEY_NAMES.index(name)]

    def _head(self, worker: str) -> list[str]:
        """The arguments every script starts with (see lua/common.lua); fresh list each call."""
        cached = self._head_cache
        if cached is None or cached[0] != self.epoch or cached[1] != worker:
            life = self.lifecycle
            named = {
                "schema": SCHEMA,
                "epoch": self.epoch,
                "worker": worker,
                "lease": repr(self.lease),
                # the recovery window: every live worker calls within a lease
                "recovery": repr(self.lease),
                "cost_ttl": _opt(life.cost_ttl),
                "estimate_ttl": _opt(life.estimate_ttl),
                "reset_interval": _opt(life.reset_interval),
                "advance_idle": "1" if life.advance_idle else "0",
                "alpha": repr(float(self.alpha)),
                "dedupe": repr(self.dedupe),
                "token_seen": "",  # set below, on every call
            }
            head = [named[name] for name in HEAD]  # wire.py's order
            cached = self._head_cache = (self.epoch, worker, head)
        head = list(cached[2])
        if self.token_seen:
            head[_TOKEN_SEEN] = pack_token(self.token_seen)
        return head

    def _call(self, name: str, args: list[str]) -> Any:
        wire = self._wire
        if wire is None:
            return self._call_client(name, args)
        with self._wire_lock:
            return self._call_wire(wire, name, args)

    def _call_wire(self, wire: Wire, name: str, args: list[str]) -> Any:
        import hiredis

        keys = self.keys
        full = False
        failures: tuple[type[BaseException], ...] = (OSError, *unavailable_errors())
        try:
            wire.open()
            while True:
                head = ("EVAL", self._sources[name]) if full else ("EVALSHA", self.script(name)[0])
                wire.send((*head, len(keys), *keys, *args))
                raw = wire.feed()
                while raw is False:
                    raw = wire.feed()
                if not isinstance(raw, hiredis.ReplyError):
                    return raw
                if str(raw).startswith("NOSCRIPT") and not full:
                    full = True  # Redis forgot the script (a restart, SCRIPT FLUSH): send it
                    continue
                raise script_reply_error(str(raw))
        except StoreUnavailable:  # e.g. READONLY from a master turned replica: connect anew
            wire.close()
            raise
        except failures as exc:
            wire.close()
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc

    def _call_client(self, name: str, args: list[str]) -> Any:
        import redis as redis_py

        try:
            return self._scripts[name](keys=self.keys, args=args)
        except unavailable_errors() as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except redis_py.ResponseError as exc:
            raise script_reply_error(str(exc)) from None

    def _read(self, op: Any) -> Any:
        try:
            return op(self.client)
        except unavailable_errors() as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
