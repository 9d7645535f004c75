"""The wire protocol: the header names a fair message carries, and the shard hash.

Producers write these headers and pick a shard; workers read them and their intake moves
messages into shards by the same hash. Neither side owns the protocol, so it lives below both,
in the standard library alone: ``worker/headers.py`` is still the only code that *parses* a
message's headers (into a ``FairHeaders`` or a ``HeaderProblem``), and ``routing.py`` builds
the Kombu queues; both take their names and rules from here.

``shard_of`` is the one rule both sides use: the producer, and the intake's Lua script, which
moves fair messages that producers published to ``q`` into their shards. Its name,
``SHARD_HASH``, is passed to the script, and a test runs both on the same keys.
"""

from __future__ import annotations

import enum
import functools
import hashlib
from collections.abc import Mapping
from typing import Any

from .errors import ConfigurationError, MessageError

__all__ = [
    "DEFAULT_SHARDS",
    "ERROR",
    "FAIRNESS_KEY",
    "JOB_ID",
    "JOB_STATES",
    "JOB_TYPE",
    "LIST_STATES",
    "ON_DEMAND",
    "PAUSED_SPILL",
    "PRIORITY",
    "REPUBLISHED",
    "SHARD_HASH",
    "SUBMITTED",
    "TOKEN",
    "ControlAnswer",
    "base_name",
    "check_text",
    "header_text",
    "is_text",
    "lane_index",
    "lane_name",
    "shard_count",
    "shard_index",
    "shard_name",
    "shard_of",
]

# Headers.
FAIRNESS_KEY = "fairness_key"
JOB_ID = "job_id"
JOB_TYPE = "job_type"
SUBMITTED = "fair_submitted"
PRIORITY = "fair_priority"  # the job's own priority, if not its type's (a positive int)
ON_DEMAND = "fair_on_demand"  # set by run_sync: somebody waits for this job's result
REPUBLISHED = "fair_republished"
ERROR = "fair_error"
# set on a paused job returned to the broker: the runtime policies' version it was returned
# under, so that no worker returns it again while that version holds
PAUSED_SPILL = "fair_paused_spill"
TOKEN = "fair_token"  # set by the gate on admission: the job's fencing token


def is_text(value: str) -> bool:
    """Whether ``value`` can be encoded as UTF-8 (it holds no lone surrogate), as the shard
    hash, the store and every log need.

    >>> is_text("10.0.0.7"), is_text("\\ud800")
    (True, False)
    """
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def header_text(value: object) -> str | None:
    """``value`` if it is a string that is Unicode text (``is_text``), else ``None``: for the
    code that reads a header before the gate has validated it (events, the intake)."""
    return value if isinstance(value, str) and is_text(value) else None


def check_text(header: str, value: object) -> None:
    """Refuse, at the producer, a header that is a string but not Unicode text: the worker
    could not take it as it is.

    Raises:
        MessageError: ``value`` holds a lone surrogate; the message names ``header``.
    """
    if isinstance(value, str) and not is_text(value):
        raise MessageError(
            f"{header} is not Unicode text (it holds a lone surrogate): {short(value)}; "
            "nothing was published"
        )


def short(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters, for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The shard hash.

#: ``fair_shards`` when not set.
DEFAULT_SHARDS = 8
#: The name of ``shard_of``'s rule, which the intake's Lua script checks before it runs.
SHARD_HASH = "sha1-32"
_MARK = ".fair."
_LANE_MARK = ".fair.lane."


def shard_of(fairness_key: str, shards: int) -> int:
    """The shard of ``fairness_key`` among ``shards``: the first 32 bits of the SHA-1 of its
    UTF-8 bytes, modulo ``shards``. The same in every process and in Lua (``redis.sha1hex``).

    >>> shard_of("10.0.0.7", 8), shard_of("10.0.0.7", 1)
    (2, 0)
    """
    return _key_hash(fairness_key) % shards


@functools.lru_cache(maxsize=4096)
def _key_hash(fairness_key: str) -> int:
    """``shard_of``'s hash of a key, remembered for the last 4,096 keys: a worker reads a
    message's shard three times or more (its slot, its events, its stragglers), a producer
    once a publish, and SHA-1 in Python is a few µs each time."""
    return int(hashlib.sha1(fairness_key.encode()).hexdigest()[:8], 16)


def shard_name(base: str, index: int) -> str:
    """``q.fair.3``: the name of shard ``index`` of queue ``base``."""
    return f"{base}{_MARK}{index}"


def shard_index(name: str) -> int | None:
    """The shard number in a shard's name, or ``None`` if ``name`` is not a shard's."""
    _, mark, tail = name.rpartition(_MARK)
    return int(tail) if mark and tail.isdigit() else None


def lane_name(base: str, index: int) -> str:
    """``q.fair.lane.3``: the name of lane ``index`` of queue ``base``, a queue of its own for
    a heavy fairness key (core/lanes.py). No shard's name: ``shard_index`` says ``None``."""
    return f"{base}{_LANE_MARK}{index}"


def lane_index(name: str) -> int | None:
    """The lane number in a lane's name, or ``None`` if ``name`` is not a lane's."""
    _, mark, tail = name.rpartition(_LANE_MARK)
    return int(tail) if mark and tail.isdigit() else None


def base_name(name: str) -> str:
    """The queue a shard or lane belongs to (``q.fair.3`` and ``q.fair.lane.3`` -> ``q``);
    any other name unchanged.

    >>> base_name("q.fair.3"), base_name("q.fair.lane.3"), base_name("q.fair")
    ('q', 'q', 'q.fair')
    """
    if lane_index(name) is not None:
        return name.rpartition(_LANE_MARK)[0]
    return name.rpartition(_MARK)[0] if shard_index(name) is not None else name


def shard_count(conf: Mapping[str, Any]) -> int:
    """``fair_shards``, checked: an int of at least 1 (1 = no shards)."""
    value = conf.get("fair_shards", DEFAULT_SHARDS)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"fair_shards: expected an integer >= 1, got {value!r}")
    return value


#: The states job control's ``fair_jobs`` lists a job in (a worker runs it, has admitted it
#: and waits for a free process, or holds it), in the order it lists them.
JOB_STATES = ("running", "reserved", "held")
#: The states job control's ``jobs`` lists: the workers' (``JOB_STATES``), then ``queued``: in
#: the broker, as the producers' registry of submissions says.
LIST_STATES = (*JOB_STATES, "queued")


class ControlAnswer(str, enum.Enum):
    """What one worker answers to job control for one job (the ``fair_cancel`` and
    ``fair_reprioritize`` remote-control commands, worker/control.py); ``celery_fair.control``
    reads the answers of the fleet and says what they mean together."""

    CANCELLED = "cancelled"  # it held the job, and dropped it: it never ran, its charge refunded
    OK = "ok"  # it held the job, which has its new priority now
    ALREADY_RUNNING = "already_running"  # it runs the job (or admitted it): too late
    REVOKED = "revoked"  # not here; in this worker's revoked set, so dropped if it comes
    REMEMBERED = "remembered"  # not here; its new priority is taken if it comes
