"""Connections to Redis for the Redis store: a client from a store URL (one server, a Redis
Cluster, or the master that Sentinels name), the hiredis connection that script calls go over,
and which errors mean "the store cannot answer now" (``StoreUnavailable``) rather than a bug.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError, StoreUnavailable

if TYPE_CHECKING:
    import redis as redis_py

__all__ = ["Wire", "client_from_url", "script_reply_error", "unavailable_errors"]

#: Timeouts of every client ``client_from_url`` opens, seconds.
_CLIENT_OPTIONS = {"socket_timeout": 5.0, "socket_connect_timeout": 5.0}


def client_from_url(
    url: str, sentinel_kwargs: Mapping[str, Any] | None = None
) -> redis_py.Redis | redis_py.RedisCluster:
    """A redis-py client of the Redis that ``url`` names (the forms ``RedisStore.from_url``
    lists)."""
    import redis as redis_py
    from redis.cluster import RedisCluster

    scheme, sep, rest = url.partition("://")
    if scheme in ("redis+cluster", "rediss+cluster"):
        node_url = f"{scheme.split('+')[0]}{sep}{rest}"
        return RedisCluster.from_url(node_url, **_CLIENT_OPTIONS)
    if scheme == "sentinel":
        return _sentinel_master(url, _CLIENT_OPTIONS, sentinel_kwargs)
    return redis_py.Redis.from_url(url, **_CLIENT_OPTIONS)


def _sentinel_master(
    url: str, client_options: dict[str, Any], sentinel_kwargs: Mapping[str, Any] | None = None
) -> redis_py.Redis:
    """A client of the master that the Sentinels of ``url`` name; it asks them again on
    every new connection, so a connection dropped after a failover finds the new master."""
    from urllib.parse import parse_qs, unquote, urlsplit

    from redis.sentinel import Sentinel

    sentinels, query = [], {}
    parts = [urlsplit(part) for part in url.split(";") if part]
    for part in parts:
        if part.scheme != "sentinel":
            raise ConfigurationError(
                f"fair_store_url: every part of a Sentinel URL starts sentinel://, got "
                f"{part.scheme}://"
            )
        sentinels.append((part.hostname or "localhost", part.port or 26379))
        query.update({k: v[-1] for k, v in parse_qs(part.query).items()})
    master = query.get("master_name")
    if not master:
        raise ConfigurationError(
            "fair_store_url: a sentinel:// URL needs the master's name, e.g. "
            "sentinel://host:26379/0?master_name=mymaster"
        )
    first = parts[0]
    db = first.path.strip("/")
    if db and not db.isdigit():
        raise ConfigurationError(f"fair_store_url: the database must be a number, got {db!r}")
    own = {k[len("sentinel_") :]: query[k] for k in ("sentinel_username", "sentinel_password")
           if k in query}  # fmt: skip
    # (redis-py typed ``Sentinel`` in 8.2; called through ``Any`` for the versions before.)
    sentinel = _untyped(Sentinel)(
        sentinels,
        sentinel_kwargs={**client_options, **own, **(sentinel_kwargs or {})},
        **client_options,
    )
    client: redis_py.Redis = _untyped(sentinel.master_for)(
        master,
        db=int(db or 0),
        username=unquote(first.username) if first.username else None,
        password=unquote(first.password) if first.password else None,
        **client_options,
    )
    return client


def unavailable_errors() -> tuple[type[Exception], ...]:
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


class Wire:
    """One connection to Redis that speaks RESP through hiredis.

    redis-py opens it (TLS, AUTH, SELECT, timeouts as the client was configured); after that,
    commands are packed and replies parsed by hiredis on the socket, at a fraction of the cost
    of a redis-py call. Blocking reads (``call``) and reads driven by an event loop (``feed``
    when the socket is readable) use the same connection logic. Not thread-safe.
    """

    def __init__(self, client: redis_py.Redis) -> None:
        self.client = client
        self.conn: Any = None
        self.sock: Any = None
        self.reader: Any = None

    def open(self) -> int:
        """Connect if not connected; return the socket's file descriptor."""
        if self.conn is None:
            import hiredis

            conn = self.client.connection_pool.make_connection()
            conn.connect()  # type: ignore[no-untyped-call]
            self.conn = conn
            self.sock = conn._sock  # type: ignore[attr-defined]
            self.reader = hiredis.Reader()
        return int(self.sock.fileno())

    def send(self, parts: tuple[str | int, ...]) -> None:
        import hiredis

        self.sock.sendall(hiredis.pack_command(parts))  # type: ignore[arg-type]

    def feed(self) -> Any:
        """Read what has arrived: the reply, or ``False`` while it is incomplete."""
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("Redis closed the connection")
        self.reader.feed(data)
        return self.reader.gets()

    def close(self) -> None:
        conn, self.conn, self.sock, self.reader = self.conn, None, None, None
        if conn is not None:
            conn.disconnect()


def script_reply_error(message: str) -> Exception:
    """The exception that an error reply from one of the scripts stands for."""
    if "celery-fair:" in message:
        return ConfigurationError(message)
    if message.startswith(("LOADING", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "BUSY", "MASTERDOWN")):
        return StoreUnavailable(f"Redis store cannot answer now: {message}")
    return RuntimeError(f"a celery-fair script failed in Redis: {message}")


def _untyped(function: Any) -> Any:
    """``function``, typed ``Any``: a call of a library's function that some of its supported
    versions type and some do not."""
    return function
