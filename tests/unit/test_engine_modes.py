"""The engine's mode and pending syncs move only along the written table (engine/modes.py)."""

from __future__ import annotations

import pytest

from celery_fair.engine.modes import TABLE, Event, Mode, State, Sync


def test_every_event_has_a_row_in_the_table():
    assert set(TABLE) == set(Event)


@pytest.mark.parametrize("outage", [Mode.HOLD, Mode.LOCAL])
def test_an_unreachable_store_moves_shared_to_the_configured_outage_mode_and_back(outage):
    state = State(Mode.SHARED, outage)
    assert state.on(Event.UNREACHABLE)
    assert state.mode is outage
    assert not state.on(Event.UNREACHABLE)  # a failed probe: still in the outage
    assert state.mode is outage
    assert state.on(Event.ANSWERED)
    assert state.mode is Mode.SHARED
    assert not state.on(Event.ANSWERED)  # an answer in shared mode changes nothing


def test_alone_no_event_moves_the_mode():
    state = State(Mode.ALONE, Mode.HOLD)
    for event in (Event.UNREACHABLE, Event.ANSWERED):
        state.on(event)
        assert state.mode is Mode.ALONE


def test_a_lost_job_owes_one_registration_until_the_store_takes_it():
    state = State(Mode.SHARED, Mode.HOLD)
    assert state.on(Event.LOST)  # the engine tells its observer once: the lease was lost
    assert not state.on(Event.LOST)  # already owed: told once
    assert state.due() is Sync.REGISTER
    assert not state.owes(Sync.RECONCILE)
    state.on(Event.UNREACHABLE)  # a register call that fails leaves it owed
    state.on(Event.ANSWERED)
    assert state.due() is Sync.REGISTER
    state.on(Event.REGISTERED)
    assert state.due() is None


def test_jobs_the_store_counts_after_their_end_owe_a_full_registration():
    state = State(Mode.SHARED, Mode.HOLD)
    state.on(Event.EXTRA)
    assert state.owes(Sync.REGISTER)
    assert state.owes(Sync.RECONCILE)
    state.on(Event.REGISTERED)
    assert not state.pending


def test_a_paused_refusal_owes_a_beat_after_any_registration_and_sending_it_settles_it():
    state = State(Mode.SHARED, Mode.LOCAL)
    state.on(Event.PAUSED)
    state.on(Event.RUNS_UNKNOWN)
    assert state.due() is Sync.REGISTER  # registration first
    state.on(Event.REGISTERED)
    assert state.due() is Sync.POLICIES
    state.on(Event.POLICIES_ASKED)
    assert state.due() is None
