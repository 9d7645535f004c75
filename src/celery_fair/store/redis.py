"""The Redis store: the fleet's shared state, one Lua script per atomic decision.

Every key of one prefix carries the same hash tag (``{prefix}``), so every script touches one
slot and runs unchanged on Redis Cluster, Sentinel and Valkey. Scripts are loaded once and
called by SHA; redis-py loads them again when the server answers NOSCRIPT (after a restart or
SCRIPT FLUSH). Time is the Redis server's clock (``TIME``), so worker clocks may drift freely.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from typing import TYPE_CHECKING, Any

from ..core.types import CostLifecycle
from ..errors import ConfigurationError, StoreUnavailable
from .base import (
    SCHEMA,
    Ask,
    Done,
    Finished,
    Grant,
    Reply,
    Running,
    Verdict,
    View,
    estimate_field,
)

if TYPE_CHECKING:
    import redis as redis_py

__all__ = ["KEY_NAMES", "RedisStore"]

KEY_NAMES = (
    "meta",
    "tiers",
    "types",
    "conflicts",
    "jobs",
    "byworker",
    "workers",
    "acc",
    "seen",
    "active",
    "est",
    "estseen",
    "minacc",
    "done",
)
"""The store's keys, in the order the scripts receive them (see ``lua/common.lua``)."""

_SCRIPTS = ("admit", "complete", "heartbeat", "register")


def _source(name: str) -> str:
    lua = resources.files(__package__) / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def _opt(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _pack_done(args: list[str], done: Iterable[Done]) -> None:
    done = list(done)
    args.append(str(len(done)))
    for d in done:
        args += (d.uid, str(d.token), _opt(d.elapsed), "1" if d.final else "0")


def _finished(done: Iterable[Done], results: list[Any]) -> list[Finished]:
    return [
        Finished(d.uid, status == b"ok", float(value) if status == b"ok" else None)
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
    """

    def __init__(
        self,
        client: redis_py.Redis,
        prefix: str = "celery_fair",
        *,
        alpha: float = 0.3,
        lifecycle: CostLifecycle | None = None,
        lease: float = 30.0,
        dedupe: float = 300.0,
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
        self.epoch = ""
        self.keys = [f"{{{prefix}}}:{name}" for name in KEY_NAMES]
        self._scripts = {name: client.register_script(_source(name)) for name in _SCRIPTS}

    @classmethod
    def from_url(cls, url: str, **options: Any) -> RedisStore:
        """A store on the Redis at ``url`` (``redis://``, ``rediss://``, ``unix://``)."""
        import redis as redis_py

        client_options = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}
        return cls(redis_py.Redis.from_url(url, **client_options), **options)

    # -- operations ------------------------------------------------------------------------

    def admit(
        self,
        worker: str,
        asks: list[Ask],
        done: list[Done] | None = None,
        watch: list[str] | None = None,
    ) -> Reply:
        """One round trip: release ``done``, admit what fits of ``asks``, read ``watch``."""
        args = self._head(worker)
        _pack_done(args, done or ())
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
            )
        watch = watch or []
        args += watch
        _, _, finished, results, tiers, types, held, workers = self._call("admit", args)
        grants = []
        for a, (status, token, estimate, acc) in zip(asks, results, strict=True):
            verdict = Verdict(status.decode())
            grants.append(
                Grant(
                    a.uid,
                    verdict,
                    int(token),
                    float(estimate) if verdict is Verdict.ADMITTED else None,
                    float(acc),
                )
            )
        return Reply(
            self.epoch,
            _finished(done or (), finished),
            grants,
            _pairs(tiers, int),
            _pairs(types, str),
            {c: bool(h) for c, h in zip(watch, held, strict=True)},
            int(workers),
        )

    def finish(self, worker: str, done: list[Done]) -> list[Finished]:
        """Release ``done`` in one round trip."""
        args = self._head(worker)
        _pack_done(args, done)
        _, _, results, _, _ = self._call("complete", args)
        return _finished(done, results)

    def heartbeat(self, worker: str, conflicts: list[str], keys: list[str]) -> View:
        args = self._head(worker)
        args.append(str(len(conflicts)))
        args += conflicts
        args += keys
        _, now, mine, reclaimed, tiers, types, held, accs, workers = self._call("heartbeat", args)
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
        )

    def register(self, worker: str, jobs: list[Running]) -> int:
        args = self._head(worker)
        args.append(str(len(jobs)))
        for j in jobs:
            args += (
                j.uid,
                str(j.token),
                j.type,
                str(j.priority),
                j.conflict,
                j.estimate_key,
                j.fairness_key,
                repr(float(j.estimate)),
                repr(float(j.default_cost)),
            )
        _, registered = self._call("register", args)
        return int(registered)

    def check(self) -> None:
        """Fail now, not at the first decision, if the store holds another schema.

        Raises:
            ConfigurationError: The prefix holds another schema version.
            StoreUnavailable: Redis cannot be reached.
        """
        found = self._read(lambda c: c.hget(self.keys[0], "schema"))
        if found is not None and found.decode() != SCHEMA:
            raise ConfigurationError(
                f"celery-fair: the store at {self.keys[0]} has schema {found.decode()}; this "
                f"celery-fair speaks schema {SCHEMA}. Use another fair_store_prefix or upgrade "
                "every worker."
            )

    # -- inspection --------------------------------------------------------------------------

    def estimate(self, type: str, job_id: str | None, default: float) -> float:
        value = self._read(lambda c: c.hget(self.keys[10], estimate_field(type, job_id)))
        return default if value is None else float(value)

    def accumulated_cost(self, fairness_key: str) -> float:
        value = self._read(lambda c: c.hget(self.keys[7], fairness_key))
        return 0.0 if value is None else float(value)

    def close(self) -> None:
        self.client.close()

    # -- internals ---------------------------------------------------------------------------

    def _head(self, worker: str) -> list[str]:
        life = self.lifecycle
        return [
            SCHEMA,
            self.epoch,
            worker,
            repr(self.lease),
            repr(self.lease),  # the recovery window: every live worker calls within a lease
            _opt(life.cost_ttl),
            _opt(life.estimate_ttl),
            _opt(life.reset_interval),
            "1" if life.advance_idle else "0",
            repr(float(self.alpha)),
            repr(self.dedupe),
        ]

    def _call(self, name: str, args: list[str]) -> Any:
        import redis as redis_py

        try:
            reply = self._scripts[name](keys=self.keys, args=args)
        except _unavailable() as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc
        except redis_py.ResponseError as exc:
            if "celery-fair:" in str(exc):
                raise ConfigurationError(str(exc)) from None
            raise
        self.epoch = reply[0].decode()
        return reply

    def _read(self, op: Any) -> Any:
        try:
            return op(self.client)
        except _unavailable() as exc:
            raise StoreUnavailable(f"Redis store unreachable: {exc}") from exc


def _unavailable() -> tuple[type[Exception], ...]:
    """The redis-py errors that mean "the store cannot answer now", not "the call is wrong".

    Besides a lost connection or a timeout: a cluster that lost a master answers CLUSTERDOWN
    (or TRYAGAIN while slots move) on every node, a slot nobody serves cannot be reached, and
    after a failover a former master answers writes with READONLY.
    """
    from redis import exceptions as e

    return (
        e.ConnectionError,
        e.TimeoutError,
        e.ClusterDownError,
        e.TryAgainError,
        e.ReadOnlyError,
        e.SlotNotCoveredError,
        e.RedisClusterException,
    )
