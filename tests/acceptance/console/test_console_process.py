"""The operator console in a real browser, against a real `sidecar serve` and real agents.

One task, four attempts, driven through the proxy by an unmodified agent under `sidecar
exec`: worker A records a thing and is frozen past its lease; worker B takes over, gets
A's thing replayed and records its own; A's late write is refused (stale generation);
worker C's write answers 500 and no probe can check it, so it waits for a human.  The
page must show all of it on the task's timeline, let the human resolve the blocked
effect (the route the CLI uses), and the next attempt must be answered with that
evidence while the upstream saw the write once.  The screenshots the docs show are
taken here.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.testing.processes import Child
from tests.acceptance.console.conftest import screenshot
from tests.acceptance.proxy.conftest import results, run_agent, start_agent, thing
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

RULES = """\
version: 1
rules:
  - name: console.things.create
    description: Create a thing; one per name and repository; a probe finds it.
    match: {host: api.things.test, method: POST, path: "/repos/{owner}/{repo}/things"}
    effect: non_idempotent
    key: "{owner}/{repo}#thing:{body.name}"
    on_unknown: probe
    timeout_s: 2
    settle_s: 2
    probe:
      request: {method: GET, path: "/repos/{owner}/{repo}/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}
    checkpoint: {stage: THING_CREATED, outputs: {thing_id: id}}
  - name: console.things.blocked
    description: No probe and no idempotency key - an unknown outcome is for a human.
    match: {host: blocked.things.test, method: POST, path: /broken/things}
    effect: non_idempotent
    key: "blocked#thing:{body.name}"
    on_unknown: block
    timeout_s: 1
    settle_s: 1
"""
HOSTS = ["api.things.test", "blocked.things.test"]
BLOCKED = thing("gear", host="blocked.things.test", path="/broken/things")
BLOCKED_KEY = "blocked#thing:gear"


def _a_stale_worker_is_refused(stack: Stack) -> None:
    slow_a = start_agent(
        stack, "312", "requests", [thing("first"), {"sleep": 8}, thing("late-from-a")],
        worker="worker-a", ttl_s=2, exec_args=["--no-isolate"],
    )  # fmt: skip
    slow_a.wait_for(r'"status": 201')
    os.kill(slow_a.pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)
        b = run_agent(
            stack, "312", "requests", [thing("first"), thing("from-b")], worker="worker-b"
        )
        assert [r["x-sidecar-effect"] for r in b] == ["replayed", "recorded"]
        slow_a.wait_for(r"late-from-a|stale_generation", timeout=30)
    finally:
        os.kill(slow_a.pid, signal.SIGCONT)
    assert results(slow_a)[-1]["body"]["code"] == "stale_generation"
    slow_a.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("console")
    rules = root / "rules.yaml"
    rules.write_text(RULES)
    started = Stack.start(root / "stack", rules=[rules], hosts=HOSTS)
    try:
        _a_stale_worker_is_refused(started)
        (blocked,) = run_agent(started, "312", "requests", [BLOCKED], worker="worker-c")
        assert blocked["status"] == 500
        assert blocked["x-sidecar-effect-state"] == "unknown"
        yield started
    finally:
        started.close()


LABELLED = "[...document.querySelectorAll('input, select, textarea')].every(e => e.labels.length)"


def open_console(page: Any, url: str, view: str = "/tasks") -> None:
    page.goto(f"{url}/ui/#{view}")
    name = view.strip("/").split("/")[0].split("?")[0]
    page.wait_for_selector(f"body[data-ready='{name}']")


def test_the_task_appears_in_the_list_with_its_lease_stage_and_effects(page: Any, stack: Stack):
    page.goto(stack.control_url + "/")  # the root redirects to the console
    page.wait_for_selector("body[data-ready='tasks']")
    assert page.url.endswith("/ui/#/tasks") or page.url.endswith("/ui/")
    row = page.locator("tr[data-task='312']")
    assert row.count() == 1
    text = row.inner_text()
    assert "waiting" in text  # an effect of it waits for a human
    assert "THING_CREATED" in text
    assert "2 completed" in text
    assert "1 unknown" in text
    assert page.locator("#waiting-count").inner_text() == "1"
    assert page.evaluate(LABELLED)
    page.keyboard.press("Tab")  # the keyboard reaches the content first
    assert page.evaluate("document.activeElement.className") == "skip"
    screenshot(page, "tasks")
    page.select_option("#f-state", "done")
    page.click("form.filters button[type=submit]")
    page.wait_for_selector("text=No task matches.")
    assert "state=done" in page.url


def test_the_timeline_shows_recorded_replayed_effects_and_the_refused_stale_write(
    page: Any, stack: Stack
):
    open_console(page, stack.control_url)
    page.click("tr[data-task='312'] a")
    page.wait_for_selector("body[data-ready='task']")
    lanes = page.locator("svg.tl .lane-label")
    assert lanes.count() == 3  # workers A, B and C, one lane per attempt
    assert [lanes.nth(i).get_attribute("data-label") for i in range(3)] == [
        "gen 1 · worker-a",
        "gen 2 · worker-b",
        "gen 3 · worker-c",
    ]
    events = page.locator("svg.tl [data-event]")
    seen = {events.nth(i).get_attribute("data-event") for i in range(events.count())}
    assert {"pending", "completed", "replayed", "unknown", "refused", "checkpoint"} <= seen
    # A's late write through the proxy, refused (and its exec's heartbeat or release)
    late = page.locator("tr.refused-row", has_text="proxy")
    assert late.count() == 1
    assert re.search(r"proxy\s+att-\S+\s+1\s+2", late.inner_text())
    # which attempt caused which effect: the trail names each event's generation
    first = page.locator("tr[data-key='acme/app#thing:first']")
    assert re.search(r"pending g1.*completed g1.*replayed g2", first.inner_text(), re.S)
    first.locator("button").click()
    detail = page.locator("#effect-detail")
    detail.wait_for(state="visible")
    assert re.search(
        r"POST https://api.things.test(:443)?/repos/acme/app/things", detail.inner_text()
    )
    assert '"status": 201' in detail.inner_text()
    screenshot(page, "task")


def test_a_blocked_effect_is_resolved_from_the_page_and_the_next_attempt_gets_the_evidence(
    page: Any, stack: Stack
):
    open_console(page, stack.control_url, "/waiting")
    card = page.locator(f"article[data-key='{BLOCKED_KEY}']")
    card.wait_for()
    text = card.inner_text()
    assert "console.things.blocked" in text
    assert "on_unknown: block" in text
    assert re.search(r"POST https://blocked.things.test(:443)?/broken/things", text)
    assert "the upstream answered 500" in text
    assert page.evaluate(LABELLED)
    screenshot(page, "waiting")

    card.locator("textarea[id$='-body']").fill('{"id": 3, "name": "gear"}')
    card.locator("input[id$='-status']").fill("201")
    card.locator("textarea[id$='-note']").fill("gear exists upstream (id 3), checked by hand")
    card.locator("input[id$='-by']").fill("alice@ops")
    deadline = time.monotonic() + 30
    while True:  # resolvable once the first try can no longer land (timeout_s + 2 settle_s)
        card.locator("button[type=submit]").click()
        card.locator(".confirm button.primary").click()
        card.locator(".ok-note, .error").first.wait_for()
        if card.locator(".ok-note").count() or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert "Resolved as completed by alice@ops" in card.inner_text()

    (again,) = run_agent(stack, "312", "requests", [BLOCKED], worker="worker-d")
    assert again["status"] == 201
    assert again["body"] == {"id": 3, "name": "gear"}
    assert stack.counts()["requests"]["POST /broken/things"] == 1  # sent once, ever

    open_console(page, stack.control_url, "/task/312")
    row = page.locator(f"tr[data-key='{BLOCKED_KEY}']")
    assert re.search(r"unknown g3.*resolved.*replayed g4", row.inner_text(), re.S)
    assert page.locator("svg.tl [data-event='resolved']").count() == 1
    open_console(page, stack.control_url, "/waiting")
    page.wait_for_selector("text=Nothing waits for a human.")


def test_the_review_shows_the_periods_figures_and_charts(page: Any, stack: Stack):
    open_console(page, stack.control_url, "/review?since=7d")
    cards = page.locator(".cards").inner_text()
    assert re.search(r"[1-9]\d*\s*stale writes refused", cards)
    assert "1 proxy" in cards  # A's late write; its exec's heartbeat and release too
    assert re.search(r"[1-9]\d*\s*duplicates prevented", cards)
    assert "1 completed" in cards  # the blocked effect, settled by alice@ops
    frame = page.frame_locator("iframe.report")
    assert frame.locator("section#refusals").count() == 1
    assert frame.locator("svg").count() >= 1
    screenshot(page, "review")


def test_the_rules_are_listed_and_a_request_is_explained(page: Any, stack: Stack):
    open_console(page, stack.control_url, "/rules")
    assert page.locator("table summary", has_text="console.things.create").count() == 1
    page.fill("#x-url", "https://api.things.test/repos/acme/app/things")
    page.fill("#x-body", '{"name": "bolt"}')
    page.click("form.explain button[type=submit]")
    explained = page.locator("#explained")
    explained.wait_for()
    text = explained.inner_text()
    assert "acme/app#thing:bolt" in text
    assert "GET api.things.test/repos/acme/app/things?name=bolt" in text
    assert page.evaluate(LABELLED)
    screenshot(page, "rules")


def test_with_a_token_the_page_asks_for_it_once_and_never_puts_it_in_a_url(
    page: Any, tmp_path: Path
):
    token = tmp_path / "token"
    token.write_text("console-s3cret-token\n")
    child = Child.python(
        "sidecar", "serve", "--data-dir", str(tmp_path / "data"),
        "--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
        "--control-token-file", str(token),
        stderr_path=tmp_path / "sidecar.log",
    )  # fmt: skip
    with child:
        url = child.wait_for(r"effect-sidecar ready control=(\S+)", timeout=30).group(1)
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.url))
        page.goto(f"{url}/ui/")
        form = page.locator("#token-form")
        form.wait_for(state="visible")
        assert page.locator("tr[data-task]").count() == 0
        page.fill("#token-input", "wrong-token")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("text=That token was refused")
        screenshot(page, "token")
        page.fill("#token-input", "console-s3cret-token")
        page.click("#token-form button[type=submit]")
        page.wait_for_selector("body[data-ready='tasks']")
        page.wait_for_selector("text=No task matches.")
        assert form.is_hidden()
        page.goto(f"{url}/ui/#/rules")  # another view: the token is not asked again
        page.wait_for_selector("body[data-ready='rules']")
        assert form.is_hidden()
        assert not [u for u in sent if "s3cret" in u]
        assert "s3cret" not in page.url
