"""Benchmark: the operator console's first paint over a store of 1,000 tasks.

    ./run bench console [--tasks 1000] [--runs 5]

A data dir is filled with ``--tasks`` tasks through the store API
(tests.support.many_tasks: a claim, a checkpoint and an effect each), a real
``sidecar serve`` runs on it, and headless chromium (Debian's, driven by Playwright) opens
``/ui/`` in a fresh context each run.  The figure is the page's own clock:
``performance.mark('ready-tasks')``, set when the task table is on screen, measured from
the start of navigation (so it includes loading the page, its modules and the first page
of ``GET /v1/tasks``).  Also: the first page at 500 rows, and all the tasks shown (pages
of 500, through "Load more").  Prints a table of medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright

from sidecar.testing.processes import Child
from tests.support import many_tasks

READY = "performance.getEntriesByName('ready-tasks')[0].startTime"


def first_paint(browser: Any, url: str, limit: int) -> tuple[float, int]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        tab = context.new_page()
        tab.goto(f"{url}/ui/#/tasks?limit={limit}")
        tab.wait_for_selector("body[data-ready='tasks']")
        return float(tab.evaluate(READY)), tab.locator("#task-rows tr").count()
    finally:
        context.close()


def all_shown(browser: Any, url: str, tasks: int) -> tuple[float, int]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        tab = context.new_page()
        tab.goto(f"{url}/ui/#/tasks?limit=500")
        tab.wait_for_selector("body[data-ready='tasks']")
        rows = tab.locator("#task-rows tr")
        while (before := rows.count()) < tasks:
            tab.click("text=Load more")
            rows.nth(before).wait_for()
        return float(tab.evaluate("performance.now()")), rows.count()
    finally:
        context.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    browser_path = shutil.which("chromium")
    if browser_path is None:
        sys.exit("bench console: needs Debian's chromium (apt-get install chromium)")
    root = Path(tempfile.mkdtemp(prefix="bench-console-"))
    started = time.perf_counter()
    many_tasks.seed(root / "data", args.tasks)
    seeded = time.perf_counter() - started
    sidecar = Child.python(
        "sidecar", "serve", "--data-dir", str(root / "data"),
        "--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
        "--log-level", "warning", stderr_path=root / "sidecar.log",
    )  # fmt: skip
    figures: dict[str, list[float]] = {"100": [], "500": [], "all": []}
    shown: dict[str, int] = {}
    with sidecar, sync_playwright() as driver:
        url = sidecar.wait_for(r"effect-sidecar ready control=(\S+)", timeout=60).group(1)
        browser = driver.chromium.launch(
            executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            first_paint(browser, url, 100)  # warm-up: the store's pages, the files' ETags
            for _ in range(args.runs):
                for limit in (100, 500):
                    ms, rows = first_paint(browser, url, limit)
                    figures[str(limit)].append(ms)
                    shown[str(limit)] = rows
                ms, rows = all_shown(browser, url, args.tasks)
                figures["all"].append(ms)
                shown["all"] = rows
        finally:
            browser.close()
    print(f"\n{args.tasks} tasks seeded through the store API in {seeded:.1f} s; "
          f"median of {args.runs} runs, fresh browser context each\n")  # fmt: skip
    print("| console view | rows on screen | ms from navigation start (median) | min | max |")
    print("|---|---:|---:|---:|---:|")
    names = {
        "100": "task list, first page (default 100 rows)",
        "500": "task list, first page of 500 rows",
        "all": f"all {args.tasks} tasks (pages of 500, Load more)",
    }
    for key, name in names.items():
        values = figures[key]
        print(
            f"| {name} | {shown[key]} | {statistics.median(values):.0f} | "
            f"{min(values):.0f} | {max(values):.0f} |"
        )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
