"""The fleet at a glance, what ``celery -A app fair status`` and ``fair top`` show.

What it shows comes from three places, each read without changing anything: the shared store
(running jobs by tier, type and key, against their caps; accumulated costs), the fair workers'
gates (``inspect stats``: held, blocked by reason, the oldest held job's wait) and the broker
(messages waiting in each queue and its shards).

``fleet_status`` gathers it into one dict of plain data; ``render`` turns that into rich tables;
neither knows about the other's source, so both are tested on their own. The commands
themselves (``commands.py``) only parse options and print.
"""

from __future__ import annotations

import math
import time
from typing import Any

from .errors import StoreUnavailable

__all__ = ["fleet_status", "gates", "render", "summarise"]

#: Keys shown by name; the others are summed in one row.
TOP_KEYS = 10


def fleet_status(app: Any, timeout: float = 1.0) -> dict[str, Any]:
    """Everything ``fair status`` shows, as plain data: ``store`` (``summarise``, or ``None``
    without a shared store; ``store_error`` if it is unreachable), ``workers`` (``gates``),
    ``tenants`` (``tenants_of``, with two-level keys) and ``queues``."""
    from .connect import declared_types, open_store, store_url
    from .settings import FairSettings

    app.loader.import_default_modules()  # the app's tasks declare job types
    settings = FairSettings.from_celery_conf(app.conf)
    types = declared_types(app, dict(settings.types))
    out: dict[str, Any] = {"now": time.time(), "store": None, "store_error": None}
    url = store_url(settings, app)
    if url is not None:
        store = open_store(settings, app)
        if store is not None:
            try:
                out["store"] = summarise(store.inspect(), settings, types)
            except StoreUnavailable as exc:  # show what the workers and the broker say
                out["store_error"] = str(exc)
            finally:
                store.close()
    out["workers"] = gates(app, timeout)
    out["tenants"] = tenants_of(out["workers"])
    out["queues"] = _queues(app, settings.shards)
    return out


def tenants_of(workers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """With two-level keys, the tenants the workers' gates name (each its top tenants by jobs
    there, and ``other``): running and held jobs summed over the workers, the highest cost any
    of them has (each has the fleet's, as of its last look at the store), most jobs first,
    ``other`` last. Empty with flat keys. O(workers x tenants)."""
    merged: dict[str, dict[str, Any]] = {}
    for gate in workers:
        for name, row in (gate.get("tenants") or {}).items():
            into = merged.setdefault(name, {"tenant": name, "running": 0, "held": 0, "cost": 0.0})
            into["running"] += int(row.get("running", 0))
            into["held"] += int(row.get("held", 0))
            into["cost"] = max(into["cost"], float(row.get("cost", 0.0)))
    return sorted(
        merged.values(),
        key=lambda r: (r["tenant"] == "other", -(r["running"] + r["held"]), r["tenant"]),
    )


def summarise(state: dict[str, Any], settings: Any, types: dict[str, Any]) -> dict[str, Any]:
    """The store's whole state (``inspect()``) as ``fair status`` shows it: running against the
    caps of every tier and type declared or capped, the heaviest keys (``TOP_KEYS``), the
    fleet's Jain index."""
    from .fleet import service

    keys = service(state, TOP_KEYS)
    tiers = {int(p): int(n) for p, n in state["tiers"].items()}
    for tier in (*(t.priority for t in types.values()), *settings.tier_caps):
        tiers.setdefault(tier, 0)  # declared or overridden, idle: shown with its cap
    return {
        "workers": len(state["workers"]),
        "tiers": [
            {"tier": p, "running": n, "cap": settings.tier_cap(p)}
            for p, n in sorted(tiers.items(), reverse=True)
        ],
        "types": [
            {
                "type": name,
                "tier": t.priority,
                "running": int(state["types"].get(name, 0)),
                "cap": t.max_concurrency,
            }
            for name, t in sorted(types.items())
        ],
        "keys": [
            {"key": k.key, "running": k.running, "cost": k.cost, "lag": k.lag, "share": k.share}
            for k in keys.top
        ],
        "other_keys": {"keys": keys.other_keys, "running": keys.other_running},
        "conflicts_held": len(state["conflicts"]),
        "jain_index": keys.jain_index,
        "recovering": state["recovering_until"] is not None
        and state["recovering_until"] > state["now"],
    }


def gates(app: Any, timeout: float) -> list[dict[str, Any]]:
    """What each fair worker's gate says of itself (``inspect stats``), by worker; a plain
    worker is left out."""
    stats = app.control.inspect(timeout=timeout).stats() or {}
    gates = []
    for node, info in sorted(stats.items()):
        pool = info.get("pool") or {}
        if "fair-held" not in pool:
            continue  # a plain worker
        gates.append(
            {
                "worker": node,
                "held": pool["fair-held"],
                "running": pool.get("fair-running", 0),  # in the pool
                "plain": pool.get("plain-running", 0),
                "slots": pool.get("max-concurrency", 0),  # the pool's size
                "reserved": pool.get("fair-reserved", 0),
                "lookahead": pool.get("fair-lookahead", 0),
                "oldest_held": pool.get("fair-oldest-held-seconds", 0.0),
                "blocked": {
                    name[len("fair-blocked-") :]: n
                    for name, n in pool.items()
                    if name.startswith("fair-blocked-")
                },
                "mode": pool.get("fair-store-mode", "alone"),
                "admitted": pool.get("fair-admitted", 0),
                "tenants": pool.get("fair-tenants", {}),
            }
        )
    return gates


def _queues(app: Any, shards: int) -> list[dict[str, Any]]:
    from .queues import queue_depths
    from .routing import is_part

    names = sorted({app.conf.task_default_queue, *(q for q in app.amqp.queues if not is_part(q))})
    try:
        with app.connection_for_read() as conn:
            depths = queue_depths(conn, names, shards, sample=0)
    except Exception as exc:  # the broker away: show the rest
        return [{"queue": name, "error": str(exc)} for name in names]
    return [
        {
            "queue": d["queue"],
            "waiting": d["lists"][0]["waiting"],
            "in_shards": sum(x["waiting"] for x in d["lists"][1:]),
        }
        for d in depths
    ]


def render(state: dict[str, Any]) -> Any:
    """``fleet_status``'s dict as rich tables, one under the other."""
    from rich.console import Group
    from rich.table import Table

    from .core import key_label

    parts: list[Any] = []
    store = state["store"]
    if state.get("store_error"):
        parts.append(f"[bold red]The shared store is unreachable:[/] {state['store_error']}")
    elif store is None:
        parts.append("No shared store: each worker decides alone (see its gate below).")
    else:
        head = (
            f"Fleet: {store['workers']} worker(s) with a lease, "
            f"{store['conflicts_held']} conflict(s) held, "
            f"Jain's index {store['jain_index']:.3f}"
        )
        if store["recovering"]:
            head += " [bold red](recovering: nothing admitted yet)[/]"
        parts.append(head)
        caps = Table(title="Running against caps", title_justify="left")
        for column in ("tier / type", "running", "cap", "use"):
            caps.add_column(column, justify="left" if column == "tier / type" else "right")
        for tier in store["tiers"]:
            caps.add_row(f"tier {tier['tier']}", *_against(tier["running"], tier["cap"]))
            for t in store["types"]:
                if t["tier"] == tier["tier"]:
                    caps.add_row(f"  {t['type']}", *_against(t["running"], t["cap"]))
        parts.append(caps)
        keys = Table(title="Heaviest keys (running now)", title_justify="left")
        for column in ("fairness key", "running", "accumulated cost (s)", "lag (s)", "share"):
            keys.add_column(column, justify="left" if column == "fairness key" else "right")
        for k in store["keys"]:
            keys.add_row(
                key_label(k["key"]),
                str(k["running"]),
                f"{k['cost']:.1f}",
                f"{k['lag']:+.1f}",
                f"{k['share']:.0%}",
            )
        other = store["other_keys"]
        if other["keys"]:
            keys.add_row(f"{other['keys']} other key(s)", str(other["running"]), "", "")
        parts.append(keys)
    gates = Table(title="Workers' gates", title_justify="left")
    for column in (
        "worker",
        "mode",
        "running",
        "plain",
        "reserved",
        "held",
        "oldest held",
        "blocked by",
    ):
        gates.add_column(column, justify="left" if column in ("worker", "mode") else "right")
    for g in state["workers"]:
        blocked = ", ".join(f"{r} {n}" for r, n in sorted(g["blocked"].items()) if n) or "-"
        gates.add_row(
            g["worker"],
            g["mode"],
            f"{g['running']}/{g['slots']}",  # fair jobs in the pool, of its processes
            str(g["plain"]),
            f"{g['reserved']}/{g['lookahead']}",  # admitted ahead of a free process
            str(g["held"]),
            f"{g['oldest_held']:.1f} s",
            blocked,
        )
    if not state["workers"]:
        gates.add_row("(no fair worker answered)", "", "", "", "", "", "", "")
    parts.append(gates)
    if state.get("tenants"):  # two-level keys (fair_key_separator)
        tenants = Table(title="Tenants (jobs on the workers)", title_justify="left")
        for column in ("tenant", "running", "held", "accumulated cost (s)"):
            tenants.add_column(column, justify="left" if column == "tenant" else "right")
        for t in state["tenants"]:
            name = t["tenant"] if t["tenant"] == "other" else key_label(t["tenant"])
            tenants.add_row(name, str(t["running"]), str(t["held"]), f"{t['cost']:.1f}")
        parts.append(tenants)
    queues = Table(title="Queues (messages waiting in the broker)", title_justify="left")
    for column in ("queue", "in the queue", "in its shards"):
        queues.add_column(column, justify="left" if column == "queue" else "right")
    for q in state["queues"]:
        if "error" in q:
            queues.add_row(q["queue"], q["error"], "")
        else:
            queues.add_row(q["queue"], str(q["waiting"]), str(q["in_shards"]))
    parts.append(queues)
    return Group(*parts)


def _against(running: int, cap: int | None) -> tuple[str, str, str]:
    if cap is None:
        return str(running), "no cap", ""
    share = running / cap if cap else math.inf
    bar = "#" * min(10, round(10 * share)) if cap else ""
    return str(running), str(cap), f"{bar:<10} {share:.0%}" if cap else "never"
