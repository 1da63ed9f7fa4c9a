"""``sidecar resume TASK`` as an operator runs it, against real processes.

A counting upstream, a real ``sidecar serve`` and an unmodified agent under ``sidecar
exec`` leave a task behind; ``python -m sidecar resume`` is then run as a subprocess,
against the store (``--data-dir``) and through the running sidecar (``--control``), and
judged by its exit code and what it prints.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import run_sidecar
from tests.acceptance.proxy.conftest import run_agent, start_agent, thing
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

# Short timeouts and settle times: a resolution is allowed once the first try can no
# longer land (timeout_s + 2 * settle_s after its attempt ended).
RULES = """\
version: 1
rules:
  - name: resume.things.blocked
    description: No probe and no safe retry - an unknown outcome is for a human.
    match: {host: blocked.things.test, method: POST, path: /broken/things}
    effect: non_idempotent
    key: "blocked#thing:{body.name}"
    on_unknown: block
    timeout_s: 1
    settle_s: 1
  - name: resume.things.probed
    description: Creates the thing, then answers 500; a probe can find it.
    match: {host: api.things.test, method: POST, path: /broken/things}
    effect: non_idempotent
    key: "broken#thing:{body.name}"
    on_unknown: probe
    timeout_s: 1
    settle_s: 1
    probe:
      request: {method: GET, path: "/repos/-/-/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}
"""
HOSTS = ["blocked.things.test", "api.things.test"]
BLOCKED_KEY = "blocked#thing:gear"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    started = Stack.start(tmp_path / "stack", rules=[rules], hosts=HOSTS)
    try:
        yield started
    finally:
        started.close()


def resume(stack: Stack, *args: str, where: str = "store") -> Any:
    """``sidecar resume 312 ...`` against the stack's store or its control API."""
    if where == "store":
        place = ["--data-dir", str(stack.data_dir)]
        place += [a for path in stack.rules for a in ("--rules", str(path))]
        place += [a for host in HOSTS for a in ("--route", f"{host}={stack.upstream_url}")]
    else:
        place = ["--control", stack.control_url]
    return run_sidecar("resume", "312", *place, *args)


def report(done: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def blocked_effect(stack: Stack) -> None:
    """An agent's write whose outcome is unknown (the API answered 500) and whose rule
    has no probe: CANNOT DETERMINE."""
    (answer,) = run_agent(
        stack, "312", "requests", [thing("gear", host="blocked.things.test", path="/broken/things")]
    )
    assert answer["status"] == 500
    assert answer["x-sidecar-effect-state"] == "unknown"


def test_a_blocked_effect_cannot_be_determined_until_a_human_resolves_it(stack: Stack) -> None:
    blocked_effect(stack)

    blocked = resume(stack)
    assert blocked.returncode == 3, blocked.stderr
    assert BLOCKED_KEY in blocked.stdout
    assert "CANNOT DETERMINE" in blocked.stdout
    assert "[ok] 1. lease free or expired" in blocked.stdout
    assert "[ok] 2. store writable" in blocked.stdout

    # The human looks at the outside world, and settles it (once no try can still land).
    deadline = time.monotonic() + 30
    while True:
        resolved = run_sidecar(
            "effects", "resolve", "312", BLOCKED_KEY, "--as", "completed",
            "--status", "201", "--body", '{"id": 1, "name": "gear"}',
            "--note", "the thing exists upstream", "--data-dir", str(stack.data_dir),
            "--rules", str(stack.rules[0]),
        )  # fmt: skip
        if resolved.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert resolved.returncode == 0, resolved.stderr

    safe = resume(stack)
    assert safe.returncode == 0, safe.stdout + safe.stderr
    assert f"REPLAY {BLOCKED_KEY}: answered from the log" in safe.stdout
    assert "SAFE TO RESUME" in safe.stdout


def test_control_gives_the_same_verdict_as_the_store(stack: Stack) -> None:
    blocked_effect(stack)
    local = resume(stack, "--json")
    remote = resume(stack, "--json", where="control")
    assert local.returncode == remote.returncode == 3, remote.stderr
    mine, theirs = report(local), report(remote)
    assert mine["verdict"] == theirs["verdict"] == "cannot_determine"
    assert [(e["key"], e["found"], e["next"]) for e in mine["effects"]] == [
        (e["key"], e["found"], e["next"]) for e in theirs["effects"]
    ]
    assert [(s["name"], s["status"]) for s in mine["steps"]] == [
        (s["name"], s["status"]) for s in theirs["steps"]
    ]


def test_json_is_one_document_with_every_step_and_the_verdict(stack: Stack) -> None:
    blocked_effect(stack)
    done = resume(stack, "--json")
    assert done.returncode == 3
    found = report(done)
    assert [s["name"] for s in found["steps"]] == [
        "lease",
        "store_writable",
        "last_checkpoint",
        "effects_probed",
        "next_attempt",
        "fencing",
        "resume_point",
        "verdict",
    ]
    for step in found["steps"]:
        assert step["status"] in {"ok", "failed", "cannot_determine", "skipped"}
        assert step["evidence"]
        assert all(isinstance(line, str) for line in step["evidence"])
    (effect,) = found["effects"]
    assert effect["key"] == BLOCKED_KEY
    assert effect["state"] == "unknown"
    assert (effect["found"], effect["next"]) == ("cannot_probe", "human")
    assert (found["verdict"], found["exit_code"], found["generation"]) == ("cannot_determine", 3, 1)
    assert "next claim gets generation 2" in found["steps"][5]["evidence"][0]


def test_a_probe_that_finds_the_effect_reports_it_found_and_records_nothing(
    stack: Stack,
) -> None:
    (answer,) = run_agent(stack, "312", "requests", [thing("bolt", path="/broken/things")])
    assert answer["status"] == 500  # ...but the upstream made the thing
    assert stack.counts()["things"] == 1

    done = resume(stack, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (effect,) = report(done)["effects"]
    assert (effect["found"], effect["next"]) == ("found", "replay")
    assert "GET http://" in effect["evidence"]
    assert "answered 200" in effect["evidence"]
    # Resume holds no lease, so it writes nothing: the next attempt's probe records it.
    (logged,) = stack.effects("312")
    assert logged["state"] == "unknown"
    assert stack.counts()["things"] == 1
    assert stack.counts()["requests"]["POST /broken/things"] == 1

    # Through the sidecar (its own routes and upstream client): the same finding.
    remote = resume(stack, "--json", where="control")
    assert remote.returncode == 0, remote.stderr
    assert [(e["found"], e["next"]) for e in report(remote)["effects"]] == [("found", "replay")]


def test_a_live_worker_holding_the_lease_exits_4(stack: Stack) -> None:
    agent = start_agent(stack, "312", "requests", [{"sleep": 60}])
    try:
        agent.wait_for(r"^pid ", timeout=30)
        stack.wait_for_lease("312")
        held = resume(stack)
        assert held.returncode == 4, held.stdout + held.stderr
        assert "HELD by attempt" in held.stdout
        remote = resume(stack, where="control")
        assert remote.returncode == 4, remote.stdout + remote.stderr
    finally:
        agent.end()


def test_a_locked_store_exits_5(stack: Stack) -> None:
    blocked_effect(stack)
    with closing(sqlite3.connect(stack.data_dir / "effects.db", isolation_level=None)) as db:
        db.execute("BEGIN EXCLUSIVE")
        try:
            locked = resume(stack)
        finally:
            db.execute("ROLLBACK")
    assert locked.returncode == 5, locked.stdout + locked.stderr
    assert "[FAILED] 2. store writable" in locked.stdout


def test_an_unknown_task_exits_1(stack: Stack) -> None:
    blocked_effect(stack)
    done = run_sidecar("resume", "999", "--data-dir", str(stack.data_dir))
    assert done.returncode == 1
    assert "never been claimed" in done.stderr
