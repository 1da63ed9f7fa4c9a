"""The console over a store of 1,000 tasks: a page at a time, never the whole list.

Correctness only; how fast the first page paints is measured by ``bench/console.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.acceptance.conftest import serving
from tests.support import many_tasks

pytestmark = pytest.mark.acceptance
TASKS = 1000


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("many")
    # A thread of its own: Playwright's sync API keeps an event loop running in this one.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(many_tasks.seed, root / "data", TASKS).result(timeout=120)
    with serving(root / "data", root / "sidecar.log") as (_, url):
        yield url


def test_the_first_page_is_painted_then_more_on_request(page: Any, control: str):
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/v1/tasks" in r.url else None)
    page.goto(f"{control}/ui/#/tasks")
    page.wait_for_selector("body[data-ready='tasks']")
    rows = page.locator("#task-rows tr")
    assert rows.count() == 100
    assert page.evaluate("performance.getEntriesByName('ready-tasks').length") == 1
    assert all("limit=100" in url for url in asked)  # one page asked for, not the list
    assert "more on the next page" in page.locator("#task-summary").inner_text()
    page.click("text=Load more")
    rows.nth(100).wait_for()
    assert rows.count() == 200


def test_pages_of_500_reach_every_task_and_the_last_has_no_next(page: Any, control: str):
    page.goto(f"{control}/ui/#/tasks?limit=500")
    page.wait_for_selector("body[data-ready='tasks']")
    rows = page.locator("#task-rows tr")
    assert rows.count() == 500
    page.click("text=Load more")
    rows.nth(999).wait_for()
    assert rows.count() == TASKS
    shown = {rows.nth(i).get_attribute("data-task") for i in (0, 499, 500, 999)}
    assert len(shown) == 4
    page.locator("text=Load more").wait_for(state="hidden")


def test_the_waiting_filter_lists_the_tasks_an_effect_of_which_waits(page: Any, control: str):
    page.goto(f"{control}/ui/#/tasks?state=waiting")
    page.wait_for_selector("body[data-ready='tasks']")
    assert page.locator("#task-rows tr").count() == TASKS // 50
    assert page.locator("#waiting-count").inner_text() == str(TASKS // 50)
