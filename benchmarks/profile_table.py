"""Where a worker's main process spends its time, from py-spy's folded stacks.

Run by hand on the files ``worker_bench.py --profile DIR`` writes:

    python benchmarks/profile_table.py DIR/redis-redis-noop-*.txt
    python benchmarks/profile_table.py --tasks 3000 --top 25 DIR/*fair-0.txt

Each file is one run; the runs of one name (``plain``, ``fair``, ``fair@...``) are summed. A
sample is one look at the process, 1/250 s by default: with ``--tasks`` (the tasks of each
run) the table shows microseconds per task instead of samples. Three views, each a column per
name:

- *by package*: where the sampled frame (the innermost one) was: celery_fair, celery, kombu,
  billiard, redis-py, amqp/librabbitmq, the standard library, or idle (waiting in
  ``epoll``/``select``, or py-spy's ``--idle``-less gaps);
- *by celery_fair entry*: every sample with a celery_fair frame, by the outermost one (the
  gate's entry point that Celery or Kombu called), so each stage of a job's life shows whole,
  with what it called in Celery, Kombu or redis-py;
- *by function* (``--top N``): the N functions with the most samples anywhere in the stack
  (inclusive), for a closer look.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

PACKAGES = (
    ("celery_fair", "celery_fair"),
    ("/celery/", "celery"),
    ("/kombu/", "kombu"),
    ("/billiard/", "billiard"),
    ("/redis/", "redis-py"),
    ("/amqp/", "amqp"),
    ("/vine/", "vine"),
)


def frames(stack: str) -> list[tuple[str, str]]:
    """``(function, file)`` of each frame of one folded stack, outermost first."""
    out = []
    for raw in stack.split(";"):
        m = _FRAME.match(raw.strip())
        out.append((m["func"], m["file"]) if m else (raw.strip(), ""))
    return out


def package(file: str) -> str:
    for needle, name in PACKAGES:
        if needle in file:
            return name
    return "stdlib/other" if file else "native"


def read(path: Path) -> Counter[str]:
    """The stacks of one py-spy ``--format raw`` file, with their sample counts."""
    stacks: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            stacks[stack] += int(count)
    return stacks


def name_of(path: Path) -> str:
    """The run's name from worker_bench's file name: ``<broker>-<state>-<task>-<name>-<i>``."""
    parts = path.stem.split("-")
    return "-".join(parts[3:-1]) if len(parts) >= 5 else path.stem


def views(stacks: Counter[str]) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    by_package: Counter[str] = Counter()
    by_entry: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    total = 0
    for stack, n in stacks.items():
        fs = frames(stack)
        total += n
        func, file = fs[-1]
        idle = func in ("poll", "select", "epoll_wait", "_poll") or "selectors.py" in file
        by_package["idle (poll)" if idle else package(file)] += n
        entry = next((f"{fn} ({Path(fl).name})" for fn, fl in fs if "celery_fair" in fl), None)
        by_entry[entry or "(no celery_fair frame)"] += n
        for fn, fl in set(fs):
            by_function[f"{fn} ({Path(fl).name})"] += n
    return by_package, by_entry, by_function, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--tasks", type=int, default=None, help="tasks per run: µs per task")
    parser.add_argument("--rate", type=int, default=250, help="py-spy's samples per second")
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    runs: dict[str, list[Counter[str]]] = {}
    for path in args.files:
        runs.setdefault(name_of(path), []).append(read(path))
    names = list(runs)
    tables: dict[str, tuple[Counter[str], Counter[str], Counter[str], int]] = {}
    for name, stacks in runs.items():
        tables[name] = views(sum(stacks, Counter()))

    def cell(name: str, n: int) -> str:
        if args.tasks is None:
            return f"{n:>10}"
        per = 1e6 * n / args.rate / (args.tasks * len(runs[name]))
        return f"{per:>10.1f}"

    unit = "samples" if args.tasks is None else "µs/task"
    for title, index in (("by package", 0), ("by celery_fair entry", 1), ("by function", 2)):
        print(f"\n{title} ({unit})")
        print(f"{'':60} " + " ".join(f"{n[:10]:>10}" for n in names))
        keys: Counter[str] = Counter()
        for name in names:
            keys.update(tables[name][index])
        shown = keys.most_common(args.top if index == 2 else None)
        for key, _ in shown:
            print(f"{key[:60]:60} " + " ".join(cell(n, tables[n][index][key]) for n in names))
        if index == 0:
            print(f"{'total':60} " + " ".join(cell(n, tables[n][3]) for n in names))


if __name__ == "__main__":
    main()
