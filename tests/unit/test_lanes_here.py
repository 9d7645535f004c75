"""A worker's part in the lanes alone (worker/lanes_here.py): where a held message counts, and
rule 3, the worker asking for the lane of a key that crowds its shard."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from celery_fair.core.lanes import LaneMap
from celery_fair.protocol import shard_of
from celery_fair.worker.held import Held, HeldJobs
from celery_fair.worker.lanes_here import LanesHere


class FleetLanes:
    """``routing.Lanes`` as the worker uses it: the map it knows, and ``ask``, which the store
    answers with the next free lane."""

    def __init__(self) -> None:
        self.map = LaneMap(1, {}, 4)
        self.asked: list[str] = []

    def learn(self, key: str, lane: int) -> None:
        self.map = LaneMap(self.map.version, {**self.map.lanes, key: lane}, 4)

    def ask(self, key: str) -> int:
        self.asked.append(key)
        lane = len(self.map.lanes)
        self.map = LaneMap(self.map.version + 1, {**self.map.lanes, key: lane}, 4)
        return lane


def held_of(key: str) -> Held:
    headers = SimpleNamespace(fairness_key=key)
    return Held(SimpleNamespace(id=f"id-{id(headers)}"), 0.0, headers, 0.0)  # type: ignore[arg-type]


def message(routing_key: str) -> Any:
    return SimpleNamespace(delivery_info={"routing_key": routing_key})


def hold(here: LanesHere, jobs: HeldJobs, key: str, routing_key: str) -> int:
    """What the gate does for a message of ``key`` that came by ``routing_key``."""
    slot = here.slot(message(routing_key), key)
    jobs.add(f"{key}-{len(jobs)}", held_of(key), slot)
    here.held(jobs, slot, key)
    return slot


def test_a_key_that_crowds_its_shard_gets_a_lane_asked_once_and_light_keys_never() -> None:
    fleet, clock = FleetLanes(), [0.0]
    here = LanesHere(fleet, shards=8, consumed=4, window=lambda: 6, now=lambda: clock[0])
    jobs = HeldJobs(crowding=here.crowding)
    shard = f"q.fair.{shard_of('H', 8)}"
    # Light keys fill H's shard up to its window: none holds half of it, nobody asks;
    for key in ("l1", "l2", "l3"):
        assert hold(here, jobs, key, shard) == shard_of("H", 8)
    assert fleet.asked == []
    # H's messages arrive (many producers, each below the threshold, published them there):
    # at the one that gives it half of a full window, the worker asks for H's lane, once,
    for _ in range(5):
        hold(here, jobs, "H", shard)
    assert fleet.asked == ["H"]
    assert here.asked == 1
    # what it holds of H from the shard straggles from then on (the three before the ask, and
    # the two after it),
    assert here.crowding.stragglers() == {shard_of("H", 8): 5}
    # and H's next messages come from its lane and count there, not in the shard.
    assert hold(here, jobs, "H", "q.fair.lane.0") == 8
    clock[0] = 5.0
    slot = hold(here, jobs, "H", shard)  # a straggler: H has its lane, no new ask
    assert fleet.asked == ["H"]
    assert here.straggler(slot)
    assert here.crowding.stragglers() == {shard_of("H", 8): 6}
    assert not here.straggler(hold(here, jobs, "l4", shard))


def test_the_keys_of_lanes_held_half_a_window_of_are_renewed() -> None:
    fleet = FleetLanes()
    fleet.ask("H")
    fleet.ask("G")
    here = LanesHere(fleet, shards=8, consumed=4, window=lambda: 6, now=lambda: 0.0)
    jobs = HeldJobs(crowding=here.crowding)
    for _ in range(3):
        hold(here, jobs, "H", "q.fair.lane.0")
    hold(here, jobs, "G", "q.fair.lane.1")
    assert here.backlogged_keys() == ["H"]


def test_a_message_from_a_lane_teaches_the_worker_its_keys_lane_and_its_held_ones_straggle():
    # Given a worker that holds four of H's messages from H's shard, its map not yet read
    # again since the producers gave H lane 2,
    fleet = FleetLanes()
    here = LanesHere(fleet, shards=8, consumed=4, window=lambda: 6, now=lambda: 0.0)
    jobs = HeldJobs(crowding=here.crowding)
    shard = shard_of("H", 8)
    for i in range(4):
        slot = here.slot(message(f"q.fair.{shard}"), "H")
        jobs.add(f"h{i}", held_of("H"), slot)
        assert not here.held(jobs, slot, "H")
    assert here.crowding.held[shard] == 4
    # when one of H's messages comes from lane 2, the worker knows H's lane from then on,
    slot = here.slot(message("q.fair.lane.2"), "H")
    assert slot == 8 + 2
    assert fleet.map.lane_of("H") == 2
    jobs.add("h4", held_of("H"), slot)
    assert here.held(jobs, slot, "H")  # new to it: what it holds of H from the shard straggles
    assert here.crowding.held[shard] == 0
    assert here.crowding.stragglers() == {shard: 4}
    # They wait in H's shard of the queue the message came from (the intake moves the rest
    # of them out of it, on Redis), whichever queue of it that was,
    for routing_key in ("q.fair.lane.2", f"q.fair.{shard}", "q"):
        assert here.shard_queue(message(routing_key), "H") == f"q.fair.{shard}"
    # and they leave the stragglers' count as they start.
    jobs.take("h0", starts=True)
    assert here.crowding.stragglers() == {shard: 3}


def test_with_lanes_on_redis_the_turns_read_the_crowdings_counts_kept_once():
    from celery_fair.worker.shard_turns import ShardTurns

    here = LanesHere(FleetLanes(), shards=8, consumed=4, window=lambda: 6, now=lambda: 0.0)
    turns = ShardTurns(8, lambda: 1, lanes=4)
    jobs = HeldJobs(turns, here.crowding)
    shard = shard_of("H", 8)
    slot = hold(here, jobs, "H", f"q.fair.{shard}")
    assert turns.held[slot] == here.crowding.held[slot] == 1  # one count, not two
    assert turns.order([f"q.fair.{shard}", "q"]) == ["q", f"q.fair.{shard}"]
    jobs.take("H-0")
    assert turns.held[slot] == 0


def test_how_far_behind_a_lanes_keys_are_is_their_least_cost_and_a_shards_is_none() -> None:
    lanes = FleetLanes()
    here = LanesHere(lanes, shards=2, consumed=3, window=lambda: 2, now=lambda: 0.0)
    cost = {"a": 5.0, "b": 2.0, "c": 7.0}.get
    lanes.ask("a")  # lane 0
    lanes.learn("b", 0)  # two keys share lane 0
    lanes.ask("c")  # lane 2 (the map's third entry)
    assert here.behind(2, lambda k: cost(k, 0.0)) == 2.0  # lane 0: b, the least
    assert here.behind(4, lambda k: cost(k, 0.0)) == 7.0  # lane 2: c
    assert here.behind(3, lambda k: cost(k, 0.0)) == 0.0  # lane 1: nobody on it
    assert here.behind(1, lambda k: cost(k, 0.0)) == 0.0  # a shard: light keys
    lanes.learn("c", 1)  # a new map: read again
    assert here.behind(3, lambda k: cost(k, 0.0)) == 7.0


def test_with_tenants_a_shard_is_as_far_behind_as_the_tenant_of_its_last_key() -> None:
    # Two-level keys: tenant S spreads its backlog over light keys in the shards, tenant T has
    # a lane; the read order puts T's lane first when T has used less, not the shards always.
    from celery_fair.worker.shard_turns import ShardTurns

    lanes = FleetLanes()
    here = LanesHere(lanes, shards=2, consumed=2, window=lambda: 4, now=lambda: 0.0)
    turns = ShardTurns(2, lambda: 4, lanes=2)
    jobs = HeldJobs(turns, here.crowding)
    tenant_cost = {"S": 9.0, "T": 4.0}
    cost = lambda key: tenant_cost.get(key.split("/")[0], 0.0)  # noqa: E731
    lanes.ask("T")  # lane 0: slot 2
    s_key = "S/1"
    shard = shard_of(s_key, 2)
    assert here.behind_tenants(shard, cost) == 0.0  # nothing read from it yet: a newcomer's
    hold(here, jobs, s_key, f"q.fair.{shard}")
    assert here.behind_tenants(shard, cost) == 9.0  # S's, whose key it last gave
    assert here.behind_tenants(2, cost) == 4.0  # T's lane
    assert here.behind(shard, cost) == 0.0  # flat keys: a shard is always furthest behind
    jobs.take(f"{s_key}-0")
    turns.behind = lambda slot: here.behind_tenants(slot, cost)
    assert turns.order([f"q.fair.{shard}", "q.fair.lane.0"])[0] == "q.fair.lane.0"


def test_with_tenants_a_shard_whose_last_key_is_out_of_its_tenants_rate_is_read_last() -> None:
    # Two-level keys on the real core: tenant S at 2 a second spreads its backlog over light
    # keys in the shards; tenant T has a lane, and has used more than S.
    from helpers import make

    from celery_fair.core import KeyPolicies
    from celery_fair.worker.shard_turns import ShardTurns

    core, clock = make(
        4,
        [("job", 1, None, "", 1.0)],
        key_separator="/",
        keys=KeyPolicies.from_mapping({"S": {"rate": "2/s", "burst": 2}}),
        tier_caps={1: None},
    )
    for i in range(3):
        core.submit(f"t{i}", "job", None, "T")
    for a in core.schedule():
        core.complete(a.uid, 1.0)  # T has used 3
    for i in range(4):
        core.submit(f"s{i}", "job", None, f"S/{i}")
    lanes = FleetLanes()
    here = LanesHere(lanes, shards=2, consumed=2, window=lambda: 4, now=lambda: 0.0)
    turns = ShardTurns(2, lambda: 4, lanes=2)
    jobs = HeldJobs(turns, here.crowding)
    turns.behind = lambda slot: here.behind_tenants(slot, core.read_cost)
    turns.behind_first = True
    lanes.ask("T")  # lane 0
    hold(here, jobs, "T", "q.fair.lane.0")
    shard = shard_of("S/9", 2)
    hold(here, jobs, "S/9", f"q.fair.{shard}")
    queues = ["q.fair.lane.0", f"q.fair.{shard}"]
    # While S has its burst, its shard is read first (S has used less);
    assert turns.order(queues)[0] == f"q.fair.{shard}"
    # once S started its burst, T's lane is: S's next message could not start;
    assert len(core.schedule()) == 2
    assert turns.order(queues)[0] == "q.fair.lane.0"
    # and when S's bucket holds a start again, S's shard is first again.
    clock.set(0.5)
    assert turns.order(queues)[0] == f"q.fair.{shard}"


def test_stragglers_are_read_past_only_while_their_keys_lane_has_messages_here() -> None:
    # Given a worker holding six of H's messages from H's shard, H's whole backlog there from
    # before it had a lane (H crowded its shard: the worker asked for it),
    fleet = FleetLanes()
    here = LanesHere(fleet, shards=8, consumed=4, window=lambda: 6, now=lambda: 0.0)
    jobs = HeldJobs(crowding=here.crowding)
    shard = shard_of("H", 8)
    for _ in range(6):
        hold(here, jobs, "H", f"q.fair.{shard}")
    assert fleet.asked == ["H"]
    assert here.crowding.stragglers() == {shard: 6}
    # then with nothing of H's lane here (its lane is empty), its shard is not read past:
    # read past, all of H's backlog would go to this worker while others idle,
    assert here.read_past() == {}
    # until a message comes from H's lane (producers route H there now): the first one says
    # so, and the stragglers, the few before the lane, are read past,
    assert here.lane_opened(hold(here, jobs, "H", "q.fair.lane.0"))
    assert here.read_past() == {shard: 6}
    assert not here.lane_opened(hold(here, jobs, "H", "q.fair.lane.0"))  # not a first
    assert not here.lane_opened(shard)  # nor a shard
    # and once none is held from the lane, not any more.
    jobs.take("H-6", starts=True)
    jobs.take("H-7", starts=True)
    assert here.read_past() == {}


def test_a_message_counts_in_the_list_the_transport_read_it_from_not_its_routing_key():
    fleet = FleetLanes()
    here = LanesHere(fleet, shards=8, consumed=4, window=lambda: 6, now=lambda: 0.0)
    jobs = HeldJobs(crowding=here.crowding)
    fleet.learn("H", 2)
    shard = f"q.fair.{shard_of('H', 8)}"
    # A message of H read from its shard, its key with a lane: a straggler, to be rerouted;
    here.read_from(shard)
    slot = here.slot(message(shard), "H")
    assert here.straggler(slot)
    assert here.shard_queue(message(shard), "H") == shard
    here.read_from(None)
    # one the intake moved to H's lane names the shard still (moved unchanged) but was read
    # from the lane: it counts there, and sends nobody to look for stragglers,
    here.read_from("q.fair.lane.2")
    slot = here.slot(message(shard), "H")
    assert slot == 8 + 2
    jobs.add("h-1", held_of("H"), slot)
    assert not here.held(jobs, slot, "H")
    # and once that delivery is over, a message handed over later (an ETA task's) counts by
    # its routing key again.
    here.read_from(None)
    assert here.straggler(here.slot(message(shard), "H"))


def test_the_redis_transport_says_which_list_it_delivers_each_message_from():
    import kombu

    from celery_fair.worker.internals import note_redis_sources

    seen: list[tuple[object, object]] = []
    told: list[str | None] = []
    queues = [kombu.Queue(name, routing_key=name) for name in ("src-a", "src-b")]
    with kombu.Connection("redis://127.0.0.1:6379/15") as conn:
        channel = conn.channel()
        assert note_redis_sources(channel, told.append)
        assert not note_redis_sources(channel, told.append)  # once (the new callback kept)
        assert not note_redis_sources(object(), told.append)  # not a Redis channel
        for queue in queues:
            queue(channel).declare()
            channel.queue_purge(queue.name)  # (a run stopped before its end)

        def got(body: Any, msg: Any) -> None:
            seen.append((body, told[-1]))  # what the transport said during this delivery
            msg.ack()

        with kombu.Consumer(channel, queues, callbacks=[got]):
            producer = kombu.Producer(conn.channel())
            # The message says src-a, but lies in src-b (as one the intake moved).
            producer.publish("moved", routing_key="src-a", declare=queues)
            channel.client.lpush("src-b", channel.client.rpop("src-a"))
            producer.publish("plain", routing_key="src-a")
            for _ in range(2):
                conn.drain_events(timeout=5)
        assert sorted(seen) == [("moved", "src-b"), ("plain", "src-a")]
        assert told[-1] is None  # and nothing is said between deliveries
        for queue in queues:
            channel.queue_delete(queue.name)
