"""``celery -A app fair ...``: the fleet as one scheduler, from the app's own settings.

A ``celery.commands`` entry point, so it takes Celery's ``-A``, ``-b`` and the rest. ``status``
prints the fleet once (``--json`` for scripts); ``top`` redraws it in place, like ``top``, over
SSH; what they show is gathered and drawn by ``overview.py`` (``fleet_status``, ``render``,
still importable from here). ``job``, ``cancel`` and ``reprioritize`` are job control's
(``control.py``), ``weights``, ``pause`` and ``resume`` the runtime policies', ``record`` writes
a simulator trace.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import click
from celery.bin.base import CeleryCommand

from .errors import ConfigurationError, StoreUnavailable
from .overview import fleet_status, gates, render
from .protocol import LIST_STATES

__all__ = ["fair", "fleet_status", "render"]


class _Argument(click.Argument):
    """A positional argument with a description for ``--help`` (click before 8.5 takes none)."""

    def __init__(self, *args: Any, description: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.description = description


class _Command(CeleryCommand):  # type: ignore[misc]
    """Celery's command, whose ``--help`` lists the positional arguments with their
    descriptions under "Arguments", not among the options without one."""

    def format_options(self, ctx: click.Context, formatter: Any) -> None:
        described = [
            (p.human_readable_name if p.required else f"[{p.human_readable_name}]", p.description)
            for p in self.get_params(ctx)
            if isinstance(p, _Argument)
        ]
        if described:
            with formatter.section("Arguments"):
                formatter.write_dl(described)
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):  # the options, in Celery's sections
            record = param.get_help_record(ctx)
            if record is not None and not isinstance(param, click.Argument):
                group = getattr(param, "help_group", None) or "Options"
                sections.setdefault(str(group), []).append(record)
        for name, records in sections.items():
            with formatter.section(name):
                formatter.write_dl(records)

    def format_arguments(self, ctx: click.Context, formatter: Any) -> None:
        """Listed by ``format_options`` (click 8.5 would list them a second time)."""


@click.group(
    name="fair",
    help="Fair dispatch: the fleet's state, as one scheduler, and its policies at run time.",
)
def fair() -> None:
    """``celery -A app fair ...``."""


@fair.command(cls=_Command)
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.pass_context
def status(ctx: click.Context, as_json: bool, timeout: float) -> None:
    """The fleet now: caps, keys, workers' gates, queues."""
    state = _gather(ctx, timeout)
    if as_json:
        click.echo(json.dumps(state, indent=1, sort_keys=True, default=str))
        return
    _rich()
    from rich.console import Console

    Console().print(render(state))


@fair.command(cls=_Command)
@click.option("--interval", default=2.0, show_default=True, help="seconds between redraws")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.option("--once", is_flag=True, help="draw one frame and exit")
@click.pass_context
def top(ctx: click.Context, interval: float, timeout: float, once: bool) -> None:
    """A live view of the fleet, redrawn in place (Ctrl-C quits)."""
    _rich()
    from rich.console import Console
    from rich.live import Live

    console = Console()
    if once:
        console.print(render(_gather(ctx, timeout)))
        return
    with Live(render(_gather(ctx, timeout)), console=console, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render(_gather(ctx, timeout)))
        except KeyboardInterrupt:
            pass


@fair.command(cls=_Command)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="trace file to write")
@click.option("--for", "length", default="10m", show_default=True, help="e.g. 90s, 10m, 1h")
@click.option(
    "--capacity", type=int, default=None, help="the trace's slots (default: the fair workers')"
)
@click.pass_context
def record(ctx: click.Context, out: str, length: str, capacity: int | None) -> None:
    """Record live arrivals and ends into a simulator trace (docs/simulator.md), with the
    policies in force: fair_keys and the runtime ones, pauses, tier caps, aging."""
    from .connect import declared_types
    from .record import Recorder, parse_duration, settings_config
    from .settings import FairSettings

    try:
        seconds = parse_duration(length)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--for") from None
    app = ctx.obj.app
    app.loader.import_default_modules()
    try:
        settings = FairSettings.from_celery_conf(app.conf)
        types = declared_types(app, dict(settings.types))
    except ConfigurationError as exc:
        raise click.UsageError(f"celery-fair: {exc}") from None
    if capacity is None:
        capacity = sum(g["slots"] for g in gates(app, 2.0))
        if not capacity:
            raise click.UsageError("no fair worker answered: give the trace's --capacity")
    app.control.enable_events()  # as Flower does: workers started without -E send them too
    recorder = Recorder()
    watch = _PolicyWatch(app, recorder)
    with watch, app.connection_for_read() as conn:
        receiver = app.events.Receiver(conn, handlers={"*": recorder.event})
        stop = threading.Timer(seconds, lambda: setattr(receiver, "should_stop", True))
        ready = receiver.on_consume_ready

        def on_consume_ready(*args: Any, **kwargs: Any) -> None:
            ready(*args, **kwargs)  # the events queue is bound: nothing from now on is missed
            if stop.ident is None:  # the first time (a reconnect calls this again)
                stop.start()
                click.echo(f"recording for {seconds:g} s into {out} (Ctrl-C stops early)", err=True)

        receiver.on_consume_ready = on_consume_ready
        try:
            receiver.capture(limit=None, timeout=None, wakeup=True)
        except KeyboardInterrupt:
            pass
        finally:
            stop.cancel()
    trace = recorder.trace(types, capacity, settings_config(settings), settings.keys)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(trace, f, indent=1)
        f.write("\n")
    click.echo(
        f"{len(trace['jobs'])} jobs written to {out}; {recorder.unfinished} still running or "
        "waiting were left out. Replay: celery-fair simulate " + out,
        err=True,
    )


class _PolicyWatch:
    """Feeds ``recorder`` the fleet's runtime policies (``fair weights``, ``fair pause``) once
    a second while a recording runs, from a thread of its own; nothing without a shared store
    (then only ``fair_keys`` are in force)."""

    INTERVAL = 1.0

    def __init__(self, app: Any, recorder: Any) -> None:
        self.app = app
        self.recorder = recorder
        self.done = threading.Event()
        self.thread: threading.Thread | None = None
        self.policies: Any = None

    def __enter__(self) -> _PolicyWatch:
        from .policies import FleetPolicies

        try:
            self.policies = FleetPolicies(self.app)
        except ConfigurationError:
            return self  # no shared store: no runtime policies
        self.look()  # those in force when the recording starts
        self.thread = threading.Thread(target=self.run, name="fair-record-policies", daemon=True)
        self.thread.start()
        return self

    def look(self) -> None:
        from .policies import describe

        try:
            _, runtime = self.policies.show()
        except StoreUnavailable:
            return  # seen again at the next look
        self.recorder.policies(time.time(), describe(runtime))

    def run(self) -> None:
        while not self.done.wait(self.INTERVAL):
            self.look()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.thread is not None:
            self.thread.join()
            self.look()  # a pause lifted in the last second ends before the trace does
        if self.policies is not None:
            self.policies.close()


@fair.command(cls=_Command)
@click.argument(
    "name",
    required=False,
    cls=_Argument,
    description="a fairness key, or a pattern of them (tenant:*), or * for every other key",
)
@click.option("--weight", type=float, help="the key's share: it is charged estimate / weight")
@click.option("--min-slots", type=int, help="while it runs fewer, its jobs go first")
@click.option("--max-concurrency", type=int, help="the most of its jobs that run at once")
@click.option("--no-cap", is_flag=True, help="remove the runtime max_concurrency")
@click.option("--max-priority", type=int, help="the highest priority its jobs may have")
@click.option("--no-max-priority", is_flag=True, help="remove the runtime max_priority")
@click.option("--rate", help="how fast its jobs may start, fleet-wide: 10/s, 600/m, 5000/h")
@click.option("--burst", type=float, help="how many starts (or seconds of cost) its rate saves up")
@click.option(
    "--per",
    type=click.Choice(["job", "cost"]),
    help="what a start charges the rate: 1 (job) or its estimate (cost)",
)
@click.option("--no-rate", is_flag=True, help="remove the runtime rate")
@click.option("--reset", is_flag=True, help="drop NAME's runtime policy: its configured one again")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.pass_context
def weights(
    ctx: click.Context,
    name: str | None,
    weight: float | None,
    min_slots: int | None,
    max_concurrency: int | None,
    no_cap: bool,
    max_priority: int | None,
    no_max_priority: bool,
    rate: str | None,
    burst: float | None,
    per: str | None,
    no_rate: bool,
    reset: bool,
    as_json: bool,
) -> None:
    """Show, or change while the fleet runs, a fairness key's (or pattern's) weight, minimum
    of slots, cap, highest priority and rate. Every worker follows within about a second
    (docs/configuration.md).

    With no NAME: every policy entry in force, fair_keys' and runtime ones. With NAME alone:
    the policy key NAME gets, and where each value comes from."""
    given = {
        "weight": weight,
        "min_slots": min_slots,
        "max_concurrency": max_concurrency,
        "max_priority": max_priority,
        "rate": rate,
        "burst": burst,
        "per": per,
    }
    options: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    dropped = {"max_concurrency": no_cap, "max_priority": no_max_priority, "rate": no_rate}
    options.update((option, None) for option, drop in dropped.items() if drop)
    if (options or reset) and name is None:
        raise click.UsageError("give the key (or pattern) to change: fair weights NAME ...")
    if options and reset:
        raise click.UsageError("--reset drops NAME's runtime policy: give no options with it")
    # Showing needs no shared store (fair_keys still apply); changing does.
    with _policies(ctx, optional=not (options or reset)) as policies:
        if policies is None:
            from .policies import RuntimePolicies
            from .settings import FairSettings

            configured = FairSettings.from_celery_conf(ctx.obj.app.conf).keys
            version, runtime = 0, RuntimePolicies()
            click.echo(
                "(no shared store: fair_keys alone apply; changing them at run time needs one)",
                err=True,
            )
        else:
            try:
                if reset:
                    policies.reset(name)
                elif options:
                    policies.set(name, **options)
                version, runtime = policies.show()
                configured = policies.configured()
            except ConfigurationError as exc:
                raise click.UsageError(f"celery-fair: {exc}") from None
    if name is not None and not options and not reset:
        _show_key(version, configured, runtime, name, as_json)
    else:
        _show_policies(version, configured, runtime, as_json)


@fair.command(cls=_Command)
@click.argument("task_id", cls=_Argument, description="the job's Celery task id")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.pass_context
def job(ctx: click.Context, task_id: str, as_json: bool, timeout: float) -> None:
    """Where job TASK_ID (a Celery task id) is, and why it is not running yet."""
    from .control import status as job_status

    found = job_status(ctx.obj.app, task_id, timeout=timeout)
    if as_json:
        click.echo(json.dumps(found, indent=1, sort_keys=True, default=str))
        return
    for line in job_lines(task_id, found):
        click.echo(line)


@fair.command(cls=_Command)
@click.option("--key", default=None, help="only this fairness key's jobs")
@click.option(
    "--state",
    type=click.Choice(LIST_STATES),
    default=None,
    help="only jobs in this state (queued: in the broker, with fair_track_submits)",
)
@click.option("--type", "job_type", default=None, help="only jobs of this type")
@click.option("--limit", default=100, show_default=True, help="at most this many jobs")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.pass_context
def jobs(
    ctx: click.Context,
    key: str | None,
    state: str | None,
    job_type: str | None,
    limit: int,
    as_json: bool,
    timeout: float,
) -> None:
    """The fair jobs the workers run, have reserved or hold, fleet-wide, and those still in
    the broker (with fair_track_submits), filtered."""
    from .control import jobs as fleet_jobs

    try:
        found = fleet_jobs(
            ctx.obj.app, key=key, state=state, type=job_type, limit=limit, timeout=timeout
        )
    except (ConfigurationError, StoreUnavailable) as exc:
        raise click.UsageError(f"celery-fair: {exc}") from None
    if as_json:
        click.echo(json.dumps(found, indent=1, sort_keys=True, default=str))
        return
    for line in jobs_lines(found):
        click.echo(line)


def jobs_lines(found: dict[str, Any]) -> list[str]:
    """``fair jobs``'s lines for ``found``, what ``celery_fair.control.jobs`` answered."""
    from .core import key_label

    lines = []
    for job in found["jobs"]:
        took = job.get("running", job.get("waited", 0.0))
        if job["state"] == "queued":  # in the broker: the registry knows its key alone
            lines.append(
                f"{job['task_id']}  key {key_label(job['fairness_key'])}  queued, "
                f"{took:.1f} s since its submit"
            )
            continue
        verb = "running for" if job["state"] == "running" else f"{job['state']},"
        on = f" {job['job_id']}" if job.get("job_id") is not None else ""
        lines.append(
            f"{job['task_id']}  {job['type']}{on}  key {key_label(job['fairness_key'])}  "
            f"priority {job['priority']}  {verb} {took:.1f} s  on {job['worker']}"
        )
    shown, matched = len(found["jobs"]), found["matched"]
    more = f" (the first {shown})" if shown < matched else ""
    lines.append(f"{matched} jobs{more} on {found['workers']} fair workers")
    return lines


def job_lines(task_id: str, found: dict[str, Any]) -> list[str]:
    """``fair job``'s words for ``found``, what ``celery_fair.control.status`` answered."""
    from .core import key_label

    where = f" on {found['worker']}" if "worker" in found else ""
    line = f"{task_id}: {found['state']}{where}"
    if found["state"] == "held" and found.get("place") is not None:
        line += (
            f", {found['place']} of {found['held']} held there, {found['place_in_key']} in its "
            f"key {key_label(found['fairness_key'])}, priority {found['priority']}"
        )
        if found.get("effective_priority") != found.get("priority"):
            line += f" (now {found['effective_priority']})"
        if found.get("expected_wait") is not None:
            line += f"; expected to start in about {found['expected_wait']:.1f} s"
            defaults = found.get("expected_wait_defaults") or 0.0
            if defaults >= 0.5:  # mostly configuration, not experience
                line += f" (a guess: {defaults:.0%} of it is default costs, nothing learned yet)"
        elif found.get("waits_for"):
            line += f"; no expected start, it waits on: {found['waits_for']}"
    elif found["state"] == "queued":  # in the broker
        line += (
            f", {found['place_in_key']} of {found['in_key']} not ended in its key "
            f"{key_label(found['fairness_key'])}, {found['place']} of {found['total']} in all"
        )
        if found.get("expected_wait") is not None:
            line += (
                f"; expected to start in about {found['expected_wait']:.1f} s (its key ends "
                f"{found['key_rate']:.2f} jobs/s)"
            )
    elif found["state"] == "unknown":
        line += ": not held by any worker, and no result recorded; if it is still in the broker"
        line += (
            ", it waits there (turn on fair_track_submits to see it there)"
            if not found.get("tracking", True)
            else ", the registry of submissions does not know it either"
        )
    return [line, *(f"  - {reason}" for reason in found.get("why", ()))]


def _when_it_arrives(found: dict[str, Any], what: str) -> str:
    """What happens to a job no worker has, if it is still in the broker (``fair cancel`` and
    ``fair reprioritize`` of a job ``unknown``): ``what`` every worker that answered does."""
    workers = found.get("remembered_by", [])
    if not workers:
        said = (
            ": not held by any worker, and no fair worker answered; a worker started later "
            "does not know it"
        )
    else:
        n = len(workers)
        said = (
            ": not held by any worker; if it is still in the broker, "
            f"{'the worker' if n == 1 else f'each of the {n} workers'} that answered will "
            f"{what} when it arrives"
        )
    if not found.get("tracking", True):
        said += " (turn on fair_track_submits to see it there)"
    return said


@fair.command(cls=_Command)
@click.argument("task_id", cls=_Argument, description="the job's Celery task id")
@click.option("--terminate", is_flag=True, help="if it runs, also signal its process")
@click.option("--signal", default=None, help="the signal --terminate sends (default TERM)")
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.pass_context
def cancel(
    ctx: click.Context,
    task_id: str,
    terminate: bool,
    signal: str | None,
    as_json: bool,
    timeout: float,
) -> None:
    """Cancel job TASK_ID: cancelled, already_running, already_done or unknown."""
    from .control import cancel as cancel_job

    found = cancel_job(ctx.obj.app, task_id, terminate=terminate, signal=signal, timeout=timeout)
    if as_json:
        click.echo(json.dumps(found, indent=1, sort_keys=True, default=str))
        return
    where = f" on {found['worker']}" if "worker" in found else ""
    terminated = " (terminated)" if found.get("terminated") else ""
    if found["state"] == "unknown":
        terminated = _when_it_arrives(found, "drop it")
    click.echo(f"{task_id}: {found['state']}{where}{terminated}")


@fair.command(cls=_Command)
@click.argument("task_id", cls=_Argument, description="the job's Celery task id")
@click.argument(
    "priority", cls=_Argument, description='a positive int, or "type" for its type\'s own priority'
)
@click.option("--json", "as_json", is_flag=True, help="one JSON document, for scripts")
@click.option("--timeout", default=1.0, show_default=True, help="seconds to wait for workers")
@click.pass_context
def reprioritize(
    ctx: click.Context, task_id: str, priority: str, as_json: bool, timeout: float
) -> None:
    """Give job TASK_ID the priority PRIORITY (a positive int, or "type" for its type's own)
    if it has not started: ok, already_running, already_done or unknown."""
    from .control import reprioritize as reprioritize_job

    wanted: int | None = None
    if priority != "type":
        try:
            wanted = int(priority)
        except ValueError:
            wanted = 0
        if wanted < 1:
            raise click.BadParameter(
                f"{priority!r} is not a positive int or 'type'", param_hint="PRIORITY"
            )
    found = reprioritize_job(ctx.obj.app, task_id, wanted, timeout=timeout)
    if as_json:
        click.echo(json.dumps(found, indent=1, sort_keys=True, default=str))
        return
    where = f" on {found['worker']}" if "worker" in found else ""
    queued = " (in the broker: it takes it when it arrives)" if found.get("queued") else ""
    if found["state"] == "unknown":
        at = "its type's priority" if wanted is None else f"priority {wanted}"
        queued = _when_it_arrives(found, f"run it at {at}")
    click.echo(f"{task_id}: {found['state']}{where}{queued}")


@fair.command(cls=_Command)
@click.option("--key", "keys", multiple=True, help="a fairness key to pause (repeatable)")
@click.option("--type", "types", multiple=True, help="a job type to pause (repeatable)")
@click.option(
    "--tenant", "tenants", multiple=True, help="a tenant to pause, all its keys (repeatable)"
)
@click.pass_context
def pause(
    ctx: click.Context, keys: tuple[str, ...], types: tuple[str, ...], tenants: tuple[str, ...]
) -> None:
    """Start nothing more of these keys, types or tenants (with fair_key_separator: all of a
    tenant's keys), fleet-wide, until "fair resume": their jobs wait, held or in the broker,
    and their aging stands still."""
    _pause(ctx, keys, types, tenants, True)


@fair.command(cls=_Command)
@click.option("--key", "keys", multiple=True, help="a fairness key to resume (repeatable)")
@click.option("--type", "types", multiple=True, help="a job type to resume (repeatable)")
@click.option("--tenant", "tenants", multiple=True, help="a tenant to resume (repeatable)")
@click.pass_context
def resume(
    ctx: click.Context, keys: tuple[str, ...], types: tuple[str, ...], tenants: tuple[str, ...]
) -> None:
    """Undo "fair pause": start these keys', types' or tenants' jobs again, fleet-wide."""
    _pause(ctx, keys, types, tenants, False)


def _pause(
    ctx: click.Context,
    keys: tuple[str, ...],
    types: tuple[str, ...],
    tenants: tuple[str, ...],
    on: bool,
) -> None:
    if not keys and not types and not tenants:
        raise click.UsageError(
            "name what to pause or resume: --key KEY, --type TYPE and/or --tenant TENANT"
        )
    with _policies(ctx) as policies:
        if tenants and on and policies.separator() is None:
            raise click.UsageError(
                "--tenant needs two-level keys (fair_key_separator): with flat keys, pause "
                "the key (--key)"
            )
        for key in keys:
            (policies.pause_key if on else policies.resume_key)(key)
        for jtype in types:
            (policies.pause_type if on else policies.resume_type)(jtype)
        for tenant in tenants:
            (policies.pause_tenant if on else policies.resume_tenant)(tenant)
        version, runtime = policies.show()
        try:
            configured = policies.configured()
        except ConfigurationError as exc:
            raise click.UsageError(f"celery-fair: {exc}") from None
    _show_policies(version, configured, runtime, False)


class _policies:
    """``FleetPolicies`` of the command's app, closed on exit; a usage error without a store,
    or ``None`` when ``optional``."""

    def __init__(self, ctx: click.Context, optional: bool = False) -> None:
        self.ctx = ctx
        self.optional = optional
        self.policies: Any = None

    def __enter__(self) -> Any:
        from .policies import FleetPolicies
        from .settings import FairSettings

        try:
            FairSettings.from_celery_conf(self.ctx.obj.app.conf)  # bad settings: always an error
            self.policies = FleetPolicies(self.ctx.obj.app)
        except ConfigurationError as exc:
            if self.optional:
                return None
            raise click.UsageError(f"celery-fair: {exc}") from None
        return self.policies

    def __exit__(self, *exc: object) -> None:
        if self.policies is not None:
            self.policies.close()


def _show_policies(version: int, configured: Any, runtime: Any, as_json: bool) -> None:
    """Every key policy entry in force (``fair_keys``' and runtime ones) and the pauses."""
    from .policies import describe, entries

    found = entries(configured, runtime)
    if as_json:
        data = {"version": version, **describe(runtime), "entries": found}
        click.echo(json.dumps(data, indent=1, sort_keys=True))
        return
    click.echo(f"key policies (fair_keys, with runtime ones on top, version {version}):")
    click.echo("\n".join(policy_lines(found)))
    click.echo(f"  paused keys: {', '.join(sorted(runtime.paused_keys)) or 'none'}")
    click.echo(f"  paused types: {', '.join(sorted(runtime.paused_types)) or 'none'}")
    if runtime.paused_tenants:
        click.echo(f"  paused tenants: {', '.join(sorted(runtime.paused_tenants))}")


_NONE_SHOWN = {
    "max_concurrency": "no cap",
    "max_priority": "no bound",
    "rate": "no limit",
    "burst": "1",
}
"""How a key option that is ``None`` is shown."""


def policy_lines(found: list[dict[str, Any]]) -> list[str]:
    """``policies.entries`` as lines: each entry, what it sets, and where it comes from."""
    lines = []
    for entry in found:
        name = "* (any other key)" if entry["name"] == "*" else entry["name"]
        if entry["from"] == "default":
            lines.append(f"  {name}: weight=1.0, min_slots=0, no cap, no bound (the defaults)")
            continue
        where = entry["from"]
        if entry["replaces"] is not None:
            where += f"; replaces fair_keys' {_terms(entry['replaces'])}"
        lines.append(f"  {name}: {_terms(entry['options'])} ({where})")
    return lines


def _show_key(version: int, configured: Any, runtime: Any, key: str, as_json: bool) -> None:
    from .policies import explain

    found = explain(configured, runtime, key)
    if as_json:
        click.echo(json.dumps({"version": version, **found}, indent=1, sort_keys=True))
        return
    click.echo("\n".join(key_lines(found, version)))


def key_lines(found: dict[str, Any], version: int) -> list[str]:
    """``policies.explain`` as lines: the entry a key follows, then each value and its source."""
    entry = found["entry"]
    if found["from"] == "default":
        head = "no entry matches it: the defaults"
    else:
        head = f"{found['from']} entry {entry!r}"
        if found["replaces"] is not None:
            head += f" (replaces fair_keys' {_terms(found['replaces'])})"
    lines = [f"{found['key']}: {head}; runtime policies version {version}"]
    for option, value in found["policy"].items():
        source = found["sources"][option]
        if source != "default":
            source = f"{source} {entry!r}"
        if value is None:
            shown = _NONE_SHOWN.get(option, "none")
        else:
            shown = f"{value:g}/s" if option == "rate" else value
        lines.append(f"  {option}: {shown} ({source})")
    lines.append(f"  paused: {'yes' if found['paused'] else 'no'}")
    return lines


def _terms(options: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(options.items())) or "(the defaults)"


def _rich() -> None:
    try:
        import rich  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "the terminal view needs rich: pip install 'celery-fair[cli]' (or use --json)"
        ) from None


def _gather(ctx: click.Context, timeout: float) -> dict[str, Any]:
    app = ctx.obj.app
    try:
        return fleet_status(app, timeout)
    except ConfigurationError as exc:
        raise click.UsageError(f"celery-fair: {exc}") from None
