"""Run Celery's own integration suite (the installed version's) against ``-P fair``.

Run by hand; about 20 minutes per broker and pool on a 2-core machine. Results go to
docs/testing.md with the command:

    pip install '.[dev,celery-suite]'
    python tests/celery_suite/run.py                       # both brokers, fair and prefork
    python tests/celery_suite/run.py --brokers redis --pools fair -k test_replace

The suite comes from the sdist of the Celery version installed here (``pip download``, kept
in ``--cache``). Its session worker runs in the pytest process on Celery's prefork pool; with
``fair`` the probe (fair_probe.py) gives it the fair pool instead and checks after every test
that the gate counts nothing inside it once Celery counts nothing reserved or running. With
``prefork`` it is Celery's own run, the baseline the pass counts are compared with. The runs
alternate (for each broker: fair, then prefork) so that both see the same machine.

Each run writes ``<pool>-<broker>.xml`` (JUnit) and ``<pool>-<broker>.json`` (the probe's
record) into ``--out``; the table at the end gives the outcomes per run and the tests whose
outcome differs between the pools.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import celery

HERE = Path(__file__).resolve().parent
BROKERS = {
    "redis": "redis://127.0.0.1:6379/4",
    "amqp": "pyamqp://guest:guest@127.0.0.1:5672//",
}
# Database 0: some of the suite's tests read the result backend through their own Redis connection,
# which is always database 0 (t/integration/tasks.py, get_redis_connection).
BACKEND = "redis://127.0.0.1:6379/0"
FILES = ("test_tasks.py", "test_inspect.py", "test_canvas.py")
NEEDED = {
    "pytest_rerunfailures": "pytest-rerunfailures",
    "pytest_timeout": "pytest-timeout",
    "pydantic": "pydantic",
}


def suite(cache: Path) -> Path:
    """The installed Celery's test tree (``t/`` and its pytest settings), downloaded once.

    Only ``t/`` is unpacked, next to nothing else: the suite then imports the installed
    ``celery``, which is what it is meant to test, not the sdist's copy.
    """
    version = celery.__version__
    root = cache / f"celery-{version}-suite"
    if (root / "t" / "integration" / "conftest.py").exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*command, "-d", str(cache), f"celery=={version}"], check=True)
    top = f"celery-{version}/"
    with tarfile.open(cache / f"celery-{version}.tar.gz") as sdist:
        members = [
            m.replace(name=m.name[len(top) :])
            for m in sdist.getmembers()
            if m.name.startswith(f"{top}t/") or m.name == f"{top}pyproject.toml"
        ]
        sdist.extractall(root, members=members, filter="data")
    return root


def run_one(root: Path, broker: str, pool: str, out: Path, args: argparse.Namespace) -> dict:
    name = f"{pool}-{broker}"
    xml, record = out / f"{name}.xml", out / f"{name}.json"
    record.unlink(missing_ok=True)
    env = {
        **os.environ,
        "TEST_BROKER": BROKERS[broker],
        "TEST_BACKEND": BACKEND,
        "CELERY_FAIR_SUITE_POOL": pool,
        "CELERY_FAIR_SUITE_REPORT": str(record),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), str(root), _pythonpath()])),
    }
    files = [str(root / "t" / "integration" / f) for f in args.files.split(",")]
    command = [sys.executable, "-m", "pytest", "-p", "celery.contrib.pytest", "-p", "fair_probe"]
    command += ["-p", "no:cacheprovider"]
    command += ["-q", "-rfE", f"--junitxml={xml}", "--rootdir", str(root), *files]
    if args.k:
        command += ["-k", args.k]
    print(f"\n== {name}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    log = out / f"{name}.log"
    with open(log, "w") as output:
        subprocess.run(command, cwd=root, env=env, stdout=output, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    outcomes = read_junit(xml)
    probe = json.loads(record.read_text()) if record.exists() else {}
    counts = Counter(outcomes.values())
    print(f"   {dict(sorted(counts.items()))} in {seconds:.0f} s (log {log})", flush=True)
    return {"name": name, "outcomes": outcomes, "seconds": seconds, "probe": probe}


def read_junit(path: Path) -> dict[str, str]:
    """Each test's outcome: passed, failed, error, skipped (xfail counts as skipped there)."""
    if not path.exists():
        return {}
    outcomes = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[test] = kinds[0].replace("failure", "failed") if kinds else "passed"
    return outcomes


def report(results: list[dict]) -> None:
    print("\n| run | passed | failed | error | skipped | minutes | prefetch | gate checks |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        c = Counter(r["outcomes"].values())
        probe = r["probe"]
        prefetch = probe.get("prefetch_count_at_start"), probe.get("prefetch_count_at_end")
        checks = "-"
        if r["name"].startswith("fair"):
            checks = (
                f"{probe.get('checked', 0)} idle checks, {len(probe.get('leaks', []))} leaks, "
                f"{probe.get('gate', {}).get('plain-started', 0)} plain runs through the gate"
                + (f", INACTIVE: {probe['inactive']}" if probe.get("inactive") else "")
            )
        print(
            f"| {r['name']} | {c['passed']} | {c['failed']} | {c['error']} | {c['skipped']} "
            f"| {r['seconds'] / 60:.1f} | {prefetch[0]} -> {prefetch[1]} | {checks} |"
        )
    by_name = {r["name"]: r["outcomes"] for r in results}
    for broker in BROKERS:
        fair, plain = by_name.get(f"fair-{broker}"), by_name.get(f"prefork-{broker}")
        if fair is None or plain is None:
            continue
        differ = sorted(t for t in fair.keys() | plain.keys() if fair.get(t) != plain.get(t))
        print(f"\n{broker}: {len(differ)} test(s) with another outcome under -P fair")
        for test in differ:
            print(f"  {test}: fair {fair.get(test)}, prefork {plain.get(test)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", default="redis,amqp")
    parser.add_argument("--pools", default="fair,prefork")
    parser.add_argument("--files", default=",".join(FILES), help="files of t/integration")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        help="fair_shards (default 1: the suite checks that its worker consumes only its "
        "'celery' queue, which a fair worker's shards would change by design)",
    )
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "celery-fair")
    parser.add_argument("--out", type=Path, default=Path("celery-suite-results"))
    args = parser.parse_args()
    missing = [pip for module, pip in NEEDED.items() if not _importable(module)]
    if missing:
        sys.exit(f"Celery's suite needs {' '.join(missing)}: pip install '.[celery-suite]'")
    root = suite(args.cache)
    # The suite's own hook for settings (t/integration/conftest.py, celery_config).
    (root / "integration-tests-config.json").write_text(json.dumps({"fair_shards": args.shards}))
    # absolute: pytest runs in the suite's folder, and writes the JUnit file and the probe's
    # record where the run reads them back (a relative --out left the table empty)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    results = [
        run_one(root, broker, pool, args.out, args)
        for broker in args.brokers.split(",")
        for pool in args.pools.split(",")
    ]
    report(results)
    (args.out / "summary.json").write_text(json.dumps(results, indent=2))


def _pythonpath() -> str:
    return os.environ.get("PYTHONPATH", "")


def _importable(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
