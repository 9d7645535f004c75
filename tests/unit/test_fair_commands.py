"""What ``celery -A app fair status`` / ``top`` / ``weights`` print, from plain data: the
formatting functions alone (real workers run them in tests/integration/test_fair_command.py)."""

from __future__ import annotations

from rich.console import Console

from celery_fair import commands
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
    summary = commands._summarise(STATE, SETTINGS, dict(SETTINGS.types))
    # tier 8 and tier 3 are capped at their priority; tier 4 at fair_tier_caps' 6; tier 2 has none.
    assert {t["tier"]: t["cap"] for t in summary["tiers"]} == {8: 8, 4: 6, 3: 3, 2: None}
    shown = text(commands.render({"store": summary, "workers": [], "queues": []}))
    rows = {row[0]: row[1:3] for row in table_rows(shown)}
    assert rows["tier 8"] == ["2", "8"]
    assert rows["tier 4"] == ["0", "6"]
    assert rows["tier 3"] == ["1", "3"]
    assert rows["tier 2"] == ["0", "no cap"]
    assert rows["repack"] == ["0", "3"]
