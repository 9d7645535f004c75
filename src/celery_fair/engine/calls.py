"""The store calls the engine plans: one type per call, each knowing its wire and its reply.

A call is planned by ``Engine.decide``, made by whoever drives the engine (``execute`` inline,
or ``request`` packed for a client that sends it and reads the reply itself, such as the
worker's store link), and its outcome is fed back with ``Engine.apply``: ``applied`` with the
reply, or ``failed`` when it raised. ``execute`` and ``request`` touch nothing but the store, so
they may run on any thread; ``applied`` and ``failed`` run where the engine runs.

================  ===========  ==============  ==========================================
call              operation    reply           a failure takes back
================  ===========  ==============  ==========================================
``AdmitCall``     admit        ``Reply``       its admissions (reverted in the core) and
                                               the ends it reported (they ride on the next)
``BeatCall``      heartbeat    ``View``        nothing
``RegisterCall``  register     ``Registered``  the marks of its jobs as known to the store
================  ===========  ==============  ==========================================
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ..core import Admission
from ..store.base import Ask, Done, Registered, Reply, Running, Store, View, conflict_field

if TYPE_CHECKING:
    from ..store.redis import RedisStore, Request
    from .engine import Engine, _Tracked

__all__ = ["NOTHING", "AdmitCall", "BeatCall", "Call", "Decision", "RegisterCall"]


@dataclass(slots=True)
class Call:
    """One exchange with the store, planned by the engine; ``execute`` may run on any thread.

    ``kind`` names the call for observers (``Observer.store_call``).
    """

    kind: ClassVar[str]
    worker: str
    watch: list[tuple[str, str]] = field(default_factory=list)  # conflicts held elsewhere
    sent: float = 0.0  # when the engine sent it, by its clock

    def execute(self, store: Store) -> Any:
        """Make the call. Raises whatever the store raises (``StoreUnavailable``...)."""
        raise NotImplementedError

    def request(self, store: RedisStore) -> Request:
        """The same call, packed for a client that sends it and reads the reply itself."""
        raise NotImplementedError

    def applied(self, engine: Engine, reply: Any) -> Decision:
        """The store answered ``reply``: the engine takes it in."""
        raise NotImplementedError

    def failed(self, engine: Engine) -> None:
        """The call raised: take back what the engine marked as sent with it."""

    def proposes(self, uid: Hashable) -> bool:
        """Whether this call asks the store to admit ``uid``."""
        return False

    def reports_ends(self) -> bool:
        """Whether this call tells the store of jobs that ended (it frees what they held)."""
        return False

    def _watched(self) -> list[str]:
        return [conflict_field(*ckey) for ckey in self.watch]


@dataclass(slots=True)
class AdmitCall(Call):
    """Report the jobs that ended, then ask to admit the core's proposals, in order."""

    kind: ClassVar[str] = "admit"
    done: list[Done] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)
    admissions: list[Admission] = field(default_factory=list)  # tentative, one per ask
    finished: list[_Tracked] = field(default_factory=list)  # the engine's records, one per done

    def execute(self, store: Store) -> Reply:
        return store.admit(self.worker, self.asks, self.done, self._watched())

    def request(self, store: RedisStore) -> Request:
        return store.admit_request(self.worker, self.asks, self.done, self._watched())

    def applied(self, engine: Engine, reply: Reply) -> Decision:
        return engine._apply_admit(self, reply)

    def failed(self, engine: Engine) -> None:
        engine._unsent(self)

    def proposes(self, uid: Hashable) -> bool:
        return any(a.uid == uid for a in self.admissions)

    def reports_ends(self) -> bool:
        return bool(self.done)


@dataclass(slots=True)
class BeatCall(Call):
    """Renew the lease and read the fleet: counts, costs, conflicts, the runtime policies."""

    kind: ClassVar[str] = "beat"
    keys: list[str] = field(default_factory=list)
    policies: int = -1  # the runtime policies' version this worker has
    tenants: list[str] = field(default_factory=list)  # two-level keys: pending tenants

    def execute(self, store: Store) -> View:
        return store.heartbeat(self.worker, self._watched(), self.keys, self.policies, self.tenants)

    def request(self, store: RedisStore) -> Request:
        return store.heartbeat_request(
            self.worker, self._watched(), self.keys, self.policies, self.tenants
        )

    def applied(self, engine: Engine, reply: View) -> Decision:
        engine._apply_beat(self, reply)
        return NOTHING


@dataclass(slots=True)
class RegisterCall(Call):
    """Put back the jobs running here that the store does not know (with ``keep``: list all
    this worker has, and the store releases the rest)."""

    kind: ClassVar[str] = "register"
    running: list[Running] = field(default_factory=list)
    keep: list[str] | None = None  # with the running jobs, all this worker has
    flipped: list[_Tracked] = field(default_factory=list)  # marked as known to the store by it

    def execute(self, store: Store) -> Registered:
        return store.register(self.worker, self.running, self.keep)

    def request(self, store: RedisStore) -> Request:
        return store.register_request(self.worker, self.running, self.keep)

    def applied(self, engine: Engine, reply: Registered) -> Decision:
        engine._apply_register(self, reply)
        return NOTHING

    def failed(self, engine: Engine) -> None:
        engine._unregistered(self)


class Decision(NamedTuple):
    """What the glue must do now."""

    start: list[Admission]  # jobs to hand to the pool, in order
    drop: list[Hashable]  # uids of copies of jobs that already finished for good: ack, never run
    call: Call | None  # the store call to make now, then feed back with ``Engine.apply``


NOTHING = Decision([], [], None)
