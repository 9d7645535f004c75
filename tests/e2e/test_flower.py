"""Flower with celery_fair.flower, in a real headless Chromium: fair workers on Redis send task
events, Flower (loaded with the helper) shows each task's fairness key, type, job id and wait on
its tasks page and task page, its worker page shows the gate's counters, and its /metrics
serves the fleet's fairness from the shared store.

Needs Debian's ``chromium`` and ``chromium-driver`` (.ci/run installs them when missing).
Set ``CELERY_FAIR_SCREENSHOTS=<dir>`` to keep the screenshots (docs/img has the last ones).

Every Flower release the helper supports (``SUPPORTED_FLOWER``) is tested: the installed one
(the ``dev`` extra's), and each older one installed on first use, without its dependencies
(the installed Flower's serve it), into a cache directory Flower is then run from.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from harness import HERE, wait_until
from packaging.version import Version
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from celery_fair import fair_headers
from celery_fair.flower import SUPPORTED_FLOWER
from celery_fair.routing import DEFAULT_SHARDS, shard_of

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLOWERCONFIG = "from celery_fair.flower import *  # noqa: F403\n"
#: The Flower releases tested besides the installed one: the last of each minor version in
#: SUPPORTED_FLOWER.
OLDER_FLOWERS = ("2.0.1", "2.1.0")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "celery-fair-tests"


def flower_path(version: str | None) -> str | None:
    """A directory holding Flower ``version`` to put first on the path (installed on first
    use), or ``None`` for the installed Flower."""
    if version is None:
        return None
    target = CACHE / f"flower-{version}"
    if not (target / "flower" / "__init__.py").exists():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target"]
        done = subprocess.run([*pip, str(target), f"flower=={version}"], capture_output=True)
        if done.returncode:
            pytest.fail(f"cannot install flower=={version}: {done.stderr.decode()[-2000:]}")
    return str(target)


def test_the_flowers_tested_are_the_supported_range():
    low, high = (Version(bound.lstrip("<>=")) for bound in SUPPORTED_FLOWER)
    import flower as installed

    for version in (*OLDER_FLOWERS, installed.__version__):
        assert low <= Version(version) < high, version


@pytest.fixture(params=["redis"])
def broker(request):
    return request.param  # Redis: the broker's Redis is the shared store Flower reads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=[None, *OLDER_FLOWERS], ids=["flower-installed", *OLDER_FLOWERS])
def flower_version(request):
    return request.param


@pytest.fixture
def flower(make_run, tmp_path, flower_version):
    """``start(run)``: a ``celery -A fairapp flower`` with the helper; its base URL."""
    procs: list[subprocess.Popen[bytes]] = []
    path = flower_path(flower_version)

    def start(run) -> str:
        config = tmp_path / "flowerconfig.py"
        config.write_text(FLOWERCONFIG)
        env = {**run.env(), "FLOWER_UNAUTHENTICATED_API": "true"}
        if path is not None:
            env["PYTHONPATH"] = os.pathsep.join([path, env["PYTHONPATH"]])
            shown = subprocess.run(
                [sys.executable, "-c", "import flower; print(flower.__version__)"],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert shown.stdout.strip() == flower_version
        port = free_port()
        with open(tmp_path / "flower.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "fairapp", "flower", f"--conf={config}",
                 f"--port={port}", "--address=127.0.0.1", "--inspect_timeout=3000"],
                cwd=HERE,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "flower.log").read_text()[-3000:])
            try:
                return get(f"{url}/healthcheck") == "OK"
            except OSError:
                return False

        wait_until(up, 30, "Flower to answer")
        return url

    yield start
    for proc in procs:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture
def browser():
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail("Chromium is missing: apt-get install chromium chromium-driver (.ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1600,1000"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()  # stops chromedriver and the browser it started, by its own PIDs


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def screenshot(driver, name: str, tmp_path: Path, version: str | None = None) -> None:
    """Keep a screenshot; an older Flower's under a name of its own."""
    if version is not None:
        name = f"flower-{version}-{name.removeprefix('flower-')}"
    where = Path(os.environ.get("CELERY_FAIR_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(where / name))


def test_flower_shows_each_tasks_fairness_fields_and_the_fleets_fairness(
    make_run, start_worker, flower, browser, tmp_path, flower_version
):
    # Given two fair workers on Redis that send task events, with two-level keys ("tenant-a"
    # is a tenant of one key, itself), and Flower with the helper,
    run = make_run(conf={"worker_send_task_events": True, "fair_key_separator": "/"})
    workers = [start_worker(run, concurrency=2) for _ in range(2)]
    url = flower(run)
    # when a client's long job holds repository linux, another of its jobs on linux waits for
    # it (held: RECEIVED), and other clients' jobs run,
    run.send("fairapp.clone", "holder", 10.0, headers=fair_headers("clone", "tenant-a", "linux"))
    wait_until(lambda: run.recorder.events(), 20, "the holder to start")
    # (Flower's /metrics serves the fleet's fairness, read from the shared store,
    running_a = 'celery_fair_fleet_running_jobs_by_key{fairness_key="tenant-a"} 1.0'
    metrics = wait_until(
        lambda: running_a in (m := get(f"{url}/metrics")) and m,
        20,
        "the holder in Flower's metrics",
        show=lambda: get(f"{url}/metrics"),
    )
    assert "celery_fair_fleet_store_up 1.0" in metrics
    assert "celery_fair_fleet_workers 2.0" in metrics
    assert "celery_fair_fleet_jain_index 1.0" in metrics  # one key runs: nobody is behind
    # and the tenants, with fair_key_separator,)
    assert 'celery_fair_fleet_running_jobs_by_tenant{tenant="tenant-a"} 1.0' in metrics
    waiter = run.send(
        "fairapp.clone", "waiter", 0.01, headers=fair_headers("clone", "tenant-a", "linux")
    )
    done = [
        run.send("fairapp.clone", f"b{i}", 0.05, headers=fair_headers("clone", "tenant-b", f"r{i}"))
        for i in range(3)
    ]
    wait_until(lambda: all(run.recorder.done_counts().get(f"b{i}") for i in range(3)), 30, "b")

    def api_task(task_id):
        return json.loads(get(f"{url}/api/task/info/{task_id}"))

    # then Flower's API has the fields: the held job's from its task-received event,
    held = wait_until(
        lambda: (t := api_task(waiter.id)).get("fairness_key") and t, 20, "the held task",
        show=lambda: api_task(waiter.id),
    )  # fmt: skip
    assert held["state"] == "RECEIVED"
    assert (held["fairness_key"], held["job_type"], held["job_id"]) == (
        "tenant-a",
        "clone",
        "linux",
    )
    held = wait_until(
        lambda: (t := api_task(waiter.id)).get("tenant") and t, 20, "the held task's tenant",
        show=lambda: api_task(waiter.id),
    )  # fmt: skip
    assert held["tenant"] == "tenant-a"  # from the gate's receipt (two-level keys)
    # a finished job's from its later events, with its wait and fencing token,
    finished = wait_until(
        lambda: (t := api_task(done[0].id)).get("state") == "SUCCESS" and t, 20, "b0's success"
    )
    assert finished["fairness_key"] == "tenant-b"
    assert finished["queue_wait"] >= 0  # numbers in the API
    assert finished["publish_wait"] >= 0  # from its fair_submitted header
    assert isinstance(finished["submitted"], float)
    assert finished["fencing_token"] >= 1
    assert finished["shard"] == shard_of("tenant-b", DEFAULT_SHARDS)

    # The tasks page shows the fairness key, type and job id as columns (Flower 2.2 on: the
    # tasks table of 2.0 and 2.1 has a fixed set of columns, which the helper leaves alone),
    browser.get(f"{url}/tasks")
    if flower_version is not None:
        wait_until(lambda: waiter.id in browser.page_source, 20, "the tasks table")
    else:

        def columns():
            found = browser.find_elements(By.CSS_SELECTOR, "th[data-column]")
            return [th.get_attribute("data-column") for th in found]

        slugs = wait_until(columns, 20, "the tasks table", show=lambda: browser.page_source[:3000])
        assert {"fairness_key", "job_type", "job_id", "queue_wait"} <= set(slugs), slugs
        labels = [th.get_attribute("textContent").strip() for th in
                  browser.find_elements(By.CSS_SELECTOR, "th[data-column]")]  # fmt: skip
        assert labels[slugs.index("fairness_key")] == "Fairness key"
        column = slugs.index("fairness_key")

        def keys_shown():
            rows = browser.find_elements(By.CSS_SELECTOR, "#tasks-table tbody tr")
            cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
            return {c[column].text for c in cells if len(c) > column}

        wait_until(lambda: {"tenant-a", "tenant-b"} <= keys_shown(), 20, "the keys in the table",
                   show=keys_shown)  # fmt: skip
        # and the waits, since publish and since receipt, as Flower writes a run time.
        assert labels[slugs.index("publish_wait")] == "Wait since publish"

        def waits_shown():
            rows = browser.find_elements(By.CSS_SELECTOR, "#tasks-table tbody tr")
            cells = [r.find_elements(By.TAG_NAME, "td") for r in rows]
            at = [slugs.index("publish_wait"), slugs.index("queue_wait")]
            return [[c[i].text for i in at] for c in cells if len(c) > max(at) and c[at[0]].text]

        shown = wait_until(waits_shown, 20, "the waits in the table", show=waits_shown)
        assert all(
            re.fullmatch(r"\d+\.\d\d (ms|s)|\d+:\d\d(:\d\d)?", w) for r in shown for w in r
        ), shown
        screenshot(browser, "flower-tasks.png", tmp_path, flower_version)
    # the task page shows them as rows,
    browser.set_window_size(1600, 1900)  # the fair fields come after Celery's own
    browser.get(f"{url}/task/{waiter.id}")
    page = browser.find_element(By.ID, "task-page").text
    for label, value in (("Fairness key", "tenant-a"), ("Tenant", "tenant-a"),
                         ("Job type", "clone"), ("Job id", "linux")):  # fmt: skip
        assert f"{label}\n{value}" in page or f"{label} {value}" in page, page
    screenshot(browser, "flower-task.png", tmp_path, flower_version)
    # and the worker page shows the gate's counters (the Pool tab).
    node = f"{workers[0].name}@{socket.gethostname()}"

    def counters_shown() -> bool:
        browser.get(f"{url}/worker/{node}")  # the first load may show stale data
        return "Fair admitted" in browser.page_source

    wait_until(counters_shown, 30, "the gate's counters")
    screenshot(browser, "flower-worker.png", tmp_path, flower_version)
