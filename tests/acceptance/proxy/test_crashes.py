"""The sidecar and the agent killed with SIGKILL at each point of the effect flow.

Each test checks the outside world afterwards (what the counting upstream holds), not
only what the sidecar says.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from contextlib import closing

import pytest

from tests.acceptance.proxy.conftest import (
    charge,
    results,
    run_agent,
    settled_effects,
    start_agent,
    thing,
)

pytestmark = pytest.mark.acceptance


def test_sidecar_killed_after_the_upstream_answered_is_probed_not_sent_again(make_stack):
    stack = make_stack(sidecar_env={"SIDECAR_FAILPOINTS": "effect.after_upstream"})
    first = start_agent(stack, "312", "requests", [thing("gear")], ttl_s=3)
    assert stack.sidecar.proc.wait(timeout=60) == -signal.SIGKILL
    first.wait_for("^done$", timeout=60)
    (lost,) = results(first)
    assert "error" in lost  # the agent saw its connection die
    assert stack.counts()["things"] == 1  # ...but the thing was created

    stack.start_sidecar()  # no failpoint this time
    # The first attempt's lease must run out before a new attempt may claim; then the
    # new attempt waits for the old one's request to settle, probes, and finds it.
    (again,) = run_agent(stack, "312", "requests", [thing("gear")], ttl_s=3, wait_s=30)
    assert again["x-sidecar-effect"] == "probed"
    assert again["body"]["name"] == "gear"
    assert stack.counts()["things"] == 1
    (effect,) = settled_effects(stack, "312", events=4)
    assert [e["event"] for e in effect["events"]] == [
        "pending",
        "unknown",
        "completed",
        "probed",
    ]


def test_sidecar_killed_before_forwarding_sends_the_effect_exactly_once(make_stack):
    stack = make_stack(sidecar_env={"SIDECAR_FAILPOINTS": "effect.after_pending"})
    start_agent(stack, "312", "requests", [thing("bolt")], ttl_s=3)
    assert stack.sidecar.proc.wait(timeout=60) == -signal.SIGKILL
    assert stack.counts()["things"] == 0
    stack.start_sidecar()
    (again,) = run_agent(stack, "312", "requests", [thing("bolt")], ttl_s=3, wait_s=30)
    assert again["x-sidecar-effect"] == "recorded"  # probed, not found, sent once
    assert stack.counts()["things"] == 1
    # Probed at once, and again once absence was proven (the first try could no longer
    # land and the rule's settle_s had passed): only then sent.
    assert stack.counts()["requests"]["GET /repos/acme/app/things"] == 2


def test_sidecar_killed_after_recording_replays_the_recorded_answer(make_stack):
    stack = make_stack(sidecar_env={"SIDECAR_FAILPOINTS": "effect.after_record"})
    start_agent(stack, "312", "requests", [charge("order-1")], ttl_s=3)
    assert stack.sidecar.proc.wait(timeout=60) == -signal.SIGKILL
    stack.start_sidecar()
    (again,) = run_agent(stack, "312", "requests", [charge("order-1")], ttl_s=3, wait_s=30)
    assert again["x-sidecar-effect"] == "replayed"
    assert stack.counts()["charges"] == 1


def test_a_stale_worker_is_refused_after_takeover_and_nothing_is_forwarded(stack):
    # Worker A makes one thing, then hangs around; its `sidecar exec` is frozen, so its
    # lease is not renewed and runs out.
    slow_a = start_agent(
        stack,
        "312",
        "requests",
        [thing("first"), {"sleep": 8}, thing("late-from-a")],
        worker="worker-a",
        ttl_s=2,
        # Not isolated: only then does the agent's traffic bypass its frozen exec, so the
        # agent itself can write while its worker is stalled (isolated, exec forwards it).
        exec_args=["--no-isolate"],
    )
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
    late = results(slow_a)[-1]
    assert late["status"] == 409
    assert late["body"]["code"] == "stale_generation"
    assert sorted(t["name"] for t in stack.things()) == ["first", "from-b"]
    assert slow_a.proc.wait(timeout=30) == 75, "exec stops a worker whose lease was lost"


def test_writes_fail_closed_while_the_store_is_locked_and_reads_still_pass(stack):
    agent = start_agent(
        stack,
        "312",
        "requests",
        [
            {"sleep": 1},
            thing("locked-out"),
            {"method": "GET", "url": "https://api.things.test/repos/acme/app/things"},
        ],
    )
    agent.wait_for(r"^pid ")
    with closing(sqlite3.connect(stack.data_dir / "effects.db", isolation_level=None)) as db:
        time.sleep(0.5)  # the claim has gone through; now take the database away
        db.execute("BEGIN EXCLUSIVE")
        agent.wait_for("^done$", timeout=60)
        db.execute("ROLLBACK")
    refused, read = results(agent)
    assert refused["status"] == 503
    assert refused["body"]["code"] == "store_unavailable"
    assert read["status"] == 200
    assert stack.counts()["things"] == 0
    (again,) = run_agent(stack, "312", "requests", [thing("locked-out")])
    assert again["x-sidecar-effect"] == "recorded"
    assert stack.counts()["things"] == 1


def test_an_agent_killed_mid_request_leaves_the_answer_recorded_not_unknown(stack):
    """SPEC §3.7: the agent dies while its request is upstream; `sidecar exec` releases
    the lease, the answer arrives 2 s later and is still recorded, so the next attempt
    is answered from the log - no CANNOT DETERMINE for an effect that happened once."""
    slow = thing("late", host="blocked.things.test", path="/slow/things?delay=2")
    first = start_agent(stack, "312", "requests", [slow])
    pid = int(first.wait_for(r"^pid (\d+)").group(1))
    deadline = time.monotonic() + 20
    while stack.counts()["requests"].get("POST /slow/things") != 1:
        assert time.monotonic() < deadline, "the request never reached the upstream"
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)  # the agent only: exec sees it die and releases the lease
    assert first.proc.wait(timeout=30) == 128 + 9

    (again,) = run_agent(stack, "312", "requests", [slow])
    assert (again["status"], again["x-sidecar-effect"]) == (201, "replayed")
    assert again["body"]["name"] == "late"
    assert stack.counts()["things"] == 1
    (effect,) = settled_effects(stack, "312", events=3)
    assert [e["event"] for e in effect["events"]] == ["pending", "completed", "replayed"]
    assert effect["events"][1]["attempt_id"] == effect["origin_attempt_id"]
