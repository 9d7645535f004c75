"""What ``celery -A app fair status`` / ``top`` / ``weights`` print, from plain data: the
formatting functions alone (real workers run them in tests/integration/test_fair_command.py)."""

from __future__ import annotations

from rich.console import Console

from celery_fair import commands, overview
from celery_fair.core import KeyPolicies
from celery_fair.policies import RuntimePolicies, entries, explain
from celery_fair.settings import FairSettings

#: One ``RedisStore.inspect()`` document: tier 8 runs 2 clones, tier 3 one job of a
#: producer-set priority no type declares.
STATE = {
    "now": 100.0,
    "recovering_until": None,
    "workers": [{"worker": "w1"}],
    "tiers": {"8": 2, "3": 1},
    "types": {"clone": 2},
    "conflicts": {},
    "jobs": [{"fairness_key": k} for k in ["a", "a", ""]],
    "costs": {"a": 3.0, "": 1.0},
}

SETTINGS = FairSettings.from_mapping(
    {
        "fair_types": {
            "clone": {"priority": 8},
            "repack": {"priority": 4, "max_concurrency": 3},
            "gc": {"priority": 2},
        },
        "fair_tier_caps": {4: 6, 2: None},
    }
)


def text(renderable) -> str:
    console = Console(record=True, width=160)
    console.print(renderable)
    return console.export_text()


def table_rows(shown: str) -> list[list[str]]:
    """The cells of every row of the rich tables in ``shown``."""
    return [
        [cell.strip() for cell in line.split("│")[1:-1]]
        for line in shown.splitlines()
        if line.startswith("│")
    ]


def test_status_shows_each_tiers_cap_in_force_not_only_the_overridden_ones():
    summary = overview.summarise(STATE, SETTINGS, dict(SETTINGS.types))
    # tier 8 and tier 3 are capped at their priority; tier 4 at fair_tier_caps' 6; tier 2 has none.
    assert {t["tier"]: t["cap"] for t in summary["tiers"]} == {8: 8, 4: 6, 3: 3, 2: None}
    shown = text(commands.render({"store": summary, "workers": [], "queues": []}))
    rows = {row[0]: row[1:3] for row in table_rows(shown)}
    assert rows["tier 8"] == ["2", "8"]
    assert rows["tier 4"] == ["0", "6"]
    assert rows["tier 3"] == ["1", "3"]
    assert rows["tier 2"] == ["0", "no cap"]
    assert rows["repack"] == ["0", "3"]


def test_a_gate_shows_the_pools_slots_and_the_reserve_apart():
    gate = {"worker": "w1@host", "mode": "shared", "running": 2, "plain": 0, "slots": 2,
            "reserved": 1, "lookahead": 1, "held": 4, "oldest_held": 1.5,
            "blocked": {"capacity": 4}}  # fmt: skip
    shown = text(commands.render({"store": None, "workers": [gate], "queues": []}))
    [row] = [r for r in table_rows(shown) if r[0] == "w1@host"]
    assert row[1:6] == ["shared", "2/2", "0", "1/1", "4"]  # mode, running, plain, reserved, held


# -- fair weights -----------------------------------------------------------------------------

CONFIGURED = KeyPolicies.from_mapping(
    {"tenant:big": {"weight": 3, "max_concurrency": 8}, "tenant:*": {"max_concurrency": 4}}
)


def test_weights_lists_the_fair_keys_entries_and_the_runtime_ones_on_top():
    runtime = RuntimePolicies().with_key("tenant:big", weight=5).with_key("ci-*", min_slots=1)
    lines = commands.policy_lines(entries(CONFIGURED, runtime))
    assert lines == [
        "  tenant:big: weight=5 (runtime; replaces fair_keys' max_concurrency=8, weight=3)",
        "  tenant:*: max_concurrency=4 (fair_keys)",
        "  ci-*: min_slots=1 (runtime)",
        "  * (any other key): weight=1.0, min_slots=0, no cap, no bound (the defaults)",
    ]
    # and with nothing set at run time, fair_keys is still shown (not "keys: none").
    assert commands.policy_lines(entries(CONFIGURED, RuntimePolicies()))[:2] == [
        "  tenant:big: max_concurrency=8, weight=3 (fair_keys)",
        "  tenant:*: max_concurrency=4 (fair_keys)",
    ]


def test_weights_of_one_key_names_the_entry_it_follows_and_where_each_value_comes_from():
    # A key matched by a fair_keys pattern takes the pattern's cap and the default weight;
    shown = commands.key_lines(explain(CONFIGURED, RuntimePolicies(), "tenant:acme"), 0)
    assert shown == [
        "tenant:acme: fair_keys entry 'tenant:*'; runtime policies version 0",
        "  weight: 1.0 (default)",
        "  min_slots: 0 (default)",
        "  max_concurrency: 4 (fair_keys 'tenant:*')",
        "  max_priority: no bound (default)",
        "  rate: no limit (default)",
        "  burst: 1 (default)",
        "  per: job (default)",
        "  paused: no",
    ]
    # a runtime entry of its own name replaces the pattern for it: the cap is gone, and it says so;
    runtime = RuntimePolicies().with_key("tenant:acme", weight=2).paused("key", "tenant:acme", True)
    shown = commands.key_lines(explain(CONFIGURED, runtime, "tenant:acme"), 4)
    assert shown == [
        "tenant:acme: runtime entry 'tenant:acme'; runtime policies version 4",
        "  weight: 2 (runtime 'tenant:acme')",
        "  min_slots: 0 (default)",
        "  max_concurrency: no cap (default)",
        "  max_priority: no bound (default)",
        "  rate: no limit (default)",
        "  burst: 1 (default)",
        "  per: job (default)",
        "  paused: yes",
    ]
    # a runtime entry that replaces a fair_keys one names what it replaced;
    runtime = RuntimePolicies().with_key("tenant:big", min_slots=1)
    found = explain(CONFIGURED, runtime, "tenant:big")
    assert found["replaces"] == {"weight": 3, "max_concurrency": 8}
    assert commands.key_lines(found, 1)[0] == (
        "tenant:big: runtime entry 'tenant:big' (replaces fair_keys' max_concurrency=8, "
        "weight=3); runtime policies version 1"
    )
    # and a key no entry matches has the defaults.
    assert commands.key_lines(explain(KeyPolicies(), RuntimePolicies(), "bob"), 0)[0] == (
        "bob: no entry matches it: the defaults; runtime policies version 0"
    )


def test_the_background_key_reads_the_same_everywhere():
    from celery_fair import flower, sim
    from celery_fair.queues import format_depths

    depths = [{"queue": "q", "lists": [{"name": "q", "waiting": 4, "consumers": 1,
                                        "keys": {"": 3, "a": 1}}]}]  # fmt: skip
    assert "oldest by key: (background) 3, a 1" in format_depths(depths)
    summary = overview.summarise(STATE, SETTINGS, dict(SETTINGS.types))
    shown = text(commands.render({"store": summary, "workers": [], "queues": []}))
    assert "(background)" in [row[0] for row in table_rows(shown)]
    assert flower._label("") == sim._key_label("") == "(background)"
    # fair job too, for a job held and for one still in the broker
    held = {
        "state": "held",
        "worker": "w1",
        "place": 1,
        "held": 2,
        "place_in_key": 1,
        "fairness_key": "",
        "priority": 4,
        "effective_priority": 4,
        "why": ["slots"],
    }
    queued = {"state": "queued", "place_in_key": 2, "in_key": 3, "fairness_key": "",
              "place": 5, "total": 9}  # fmt: skip
    assert commands.job_lines("t1", held) == [
        "t1: held on w1, 1 of 2 held there, 1 in its key (background), priority 4",
        "  - slots",
    ]
    assert commands.job_lines("t2", queued) == [
        "t2: queued, 2 of 3 not ended in its key (background), 5 of 9 in all"
    ]


# -- help ---------------------------------------------------------------------------------------


def test_every_commands_help_describes_its_arguments_apart_and_shows_no_markup():
    import click
    from click.testing import CliRunner

    for name, command in commands.fair.commands.items():
        out = CliRunner().invoke(commands.fair, [name, "--help"], terminal_width=100)
        assert out.exit_code == 0, (name, out.output)
        assert "``" not in out.output, name  # no raw RST
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        options = out.output.split("Options:")[1]
        for argument in arguments:
            metavar = argument.human_readable_name
            listed = [x.split()[0] for x in options.splitlines() if x.strip()]
            assert not {metavar, f"[{metavar}]"} & set(listed), name
            [line] = [x for x in out.output.split("Options:")[0].splitlines()
                      if x.strip().lstrip("[").startswith(metavar)]  # fmt: skip
            assert len(line.split()) > 1, (name, line)  # with a description


def test_weights_without_a_shared_store_shows_the_fair_keys_in_force(tmp_path):
    # Given an app on an in-memory broker with fair_keys and no shared store,
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).parent.parent / "integration"
    conf = {"fair_keys": {"tenant:acme": {"weight": 3}, "tenant:*": {"max_concurrency": 4}}}
    env = {
        **os.environ,
        "PYTHONPATH": str(here),
        "FAIRAPP_BROKER": "memory://",
        "FAIRAPP_QUEUE": "q",
        "FAIRAPP_PREFIX": "p",
        "FAIRAPP_BACKEND": "",
        "FAIRAPP_CONF": json.dumps(conf),
    }

    def fair(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "celery", "-A", "fairapp", "fair", *args]
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)

    # when fair weights is asked, alone and for one key,
    shown, one = fair("weights"), fair("weights", "tenant:bob")
    # then it shows the entries fair_keys sets, and says why nothing can change at run time,
    assert shown.returncode == 0, shown.stderr
    assert "tenant:acme" in shown.stdout, shown.stdout
    assert "tenant:*" in shown.stdout, shown.stdout
    assert "no shared store" in shown.stderr
    assert one.returncode == 0, one.stderr
    assert "tenant:*" in one.stdout, one.stdout
    # while a change is refused with the reason, not a traceback.
    change = fair("weights", "tenant:bob", "--weight", "2")
    assert change.returncode != 0
    assert "shared store" in change.stderr
    assert "Traceback" not in change.stderr


def test_with_two_level_keys_status_shows_the_tenants_the_workers_name():
    def gate(name, tenants):
        return {"worker": name, "mode": "shared", "running": 1, "plain": 0, "slots": 2,
                "reserved": 0, "lookahead": 0, "held": 3, "oldest_held": 0.5, "blocked": {},
                "tenants": tenants}  # fmt: skip

    workers = [
        gate("w1", {"acme": {"running": 2, "held": 5, "cost": 7.5},
                    "other": {"running": 1, "held": 0, "cost": 1.0}}),
        gate("w2", {"acme": {"running": 1, "held": 1, "cost": 8.0},
                    "beta": {"running": 1, "held": 0, "cost": 2.0}}),
    ]  # fmt: skip
    tenants = overview.tenants_of(workers)
    assert [t["tenant"] for t in tenants] == ["acme", "beta", "other"]  # most jobs, other last
    assert tenants[0] == {"tenant": "acme", "running": 3, "held": 6, "cost": 8.0}
    shown = text(commands.render({"store": None, "workers": workers, "tenants": tenants,
                                  "queues": []}))  # fmt: skip
    rows = {r[0]: r[1:] for r in table_rows(shown)}
    assert rows["acme"] == ["3", "6", "8.0"]
    assert rows["other"] == ["1", "0", "1.0"]
    # flat keys: no tenant table
    assert overview.tenants_of([gate("w3", {})]) == []
    assert "Tenants" not in text(commands.render({"store": None, "workers": [], "queues": []}))
