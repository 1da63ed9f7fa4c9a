"""Two sidecars on two "nodes" - separate `sidecar serve` processes and ports - sharing one
PostgreSQL store: a lease taken on one fences the other's worker.

The seed's worked scenario (task #312) across nodes: worker A runs the unmodified demo
agent through node A, pushes and freezes (SIGSTOP of its `sidecar exec` and agent) until
its lease runs out; worker B takes over through node B.  Counted on the GitHub emulator
and in the store.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest
import requests

from sidecar.testing.github import TASK
from sidecar.testing.processes import Child
from tests.acceptance.proxy.conftest import RULES
from tests.support.nodes import (
    GitHubNodes,
    Node,
    SharedStore,
    freeze_after_push,
    thaw,
    wait_frozen,
)

pytestmark = pytest.mark.acceptance

PULLS_PATH = "/repos/acme/app/pulls"
COMMENTS_PATH = "/repos/acme/app/issues/1/comments"
PULLS = f"https://api.github.com{PULLS_PATH}"
COMMENTS = f"https://api.github.com{COMMENTS_PATH}"


@pytest.fixture
def store(postgres_server: str) -> Iterator[SharedStore]:
    """A store of this test's own: a fresh schema, dropped afterwards."""
    shared = SharedStore.create(postgres_server)
    yield shared
    shared.drop()


@pytest.fixture
def nodes(tmp_path: Path, store: SharedStore) -> Iterator[tuple[Node, Node]]:
    """Two bare `sidecar serve` processes on the shared store."""
    a = Node.start(tmp_path / "node-a", "node-a", store.url)
    try:
        b = Node.start(tmp_path / "node-b", "node-b", store.url)
    except BaseException:
        a.stop()
        raise
    yield a, b
    b.stop()
    a.stop()


@pytest.fixture
def world(tmp_path: Path, store: SharedStore) -> Iterator[GitHubNodes]:
    """One GitHub emulator and one model; node-a and node-b in front, on the shared store."""
    started = GitHubNodes.start(tmp_path / "world", store.url)
    yield started
    started.close()


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso)


def test_a_lease_claimed_on_one_node_is_refused_on_the_other_until_it_expires(nodes):
    a, b = nodes
    status, granted = a.claim(TASK, "worker-a", ttl_s=2)
    assert (status, granted["generation"]) == (200, 1)
    first = {"attempt_id": granted["attempt_id"], "generation": 1}
    assert a.checkpoint(TASK, **first, stage="READ_COMPLETE")[0] == 201

    status, held = b.claim(TASK, "worker-b", ttl_s=30)
    assert (status, held["code"]) == (409, "lease_held")
    assert (held["holder"], held["holder_attempt_id"]) == ("worker-a", granted["attempt_id"])
    assert at(held["lease_expires_at"]) == at(granted["lease_expires_at"])

    deadline = time.monotonic() + 30
    while (answer := b.claim(TASK, "worker-b", ttl_s=30))[0] == 409:
        assert answer[1]["code"] == "lease_held"
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.1)
    status, taken = answer
    assert status == 200, taken
    assert taken["generation"] == granted["generation"] + 1
    assert taken["last_checkpoint"]["stage"] == "READ_COMPLETE", "A's checkpoint, read on B"
    gen_1, gen_2 = b.task(TASK)["attempts"]
    assert at(gen_2["claimed_at"]) >= at(gen_1["lease_until"]), "granted only after expiry"

    # A was slow, not dead: its late write, on its own node, is fenced; B's is accepted.
    status, late = a.checkpoint(TASK, **first, stage="PATCH_GENERATED")
    assert (status, late["code"], late["current_generation"]) == (409, "stale_generation", 2)
    second = {"attempt_id": taken["attempt_id"], "generation": 2}
    assert b.checkpoint(TASK, **second, stage="PATCH_GENERATED")[0] == 201
    assert a.post(f"/v1/tasks/{TASK}/heartbeat", first)[1]["code"] == "stale_generation"

    # One store: node A answers what was decided on node B, and the other way round.
    seen_on_a = a.task(TASK)
    assert (seen_on_a["generation"], seen_on_a["lease"]["worker"]) == (2, "worker-b")
    assert seen_on_a["last_checkpoint"]["attempt_id"] == taken["attempt_id"]
    refusals = b.task(TASK)["refused_writes"]
    assert [(r["operation"], r["attempt_id"]) for r in refusals] == [
        ("checkpoint", granted["attempt_id"]),
        ("heartbeat", granted["attempt_id"]),
    ]


def test_a_frozen_worker_on_one_node_is_taken_over_on_the_other_and_fenced(world, store):
    node_a, node_b = world.nodes["node-a"], world.nodes["node-b"]
    freeze = freeze_after_push(world.root / "worker-a")
    a = world.agent("node-a", "worker-a", freeze=freeze)
    branch, a_commit = wait_frozen(a, freeze)  # pushed; frozen before it saw the answer
    assert not any(line.startswith("pushed") for line in a.lines)
    assert world.branches() == {branch: a_commit}
    push = {e["rule"]: e for e in node_b.effects(TASK)}["github.git.push"]
    assert push["state"] == "completed", "node A recorded the push before answering git"

    # A's lease runs out; B, on the other node, claims (generation 2) and runs the task.
    b = world.agent("node-b", "worker-b")
    b.wait_for("^done ", timeout=90)
    assert b.proc.wait(timeout=30) == 0
    attempt_a, attempt_b = node_b.task(TASK)["attempts"]
    assert (attempt_a["generation"], attempt_b["generation"]) == (1, 2)
    assert attempt_a["end_reason"] == "expired"
    assert any("the first push stands" in line for line in b.lines), "B's push was replayed"
    assert "opened PR #1 https://github.com/acme/app/pull/1" in b.lines
    (pull,) = world.pulls()

    # What A's agent does next - open its pull request, comment on it - sent with A's proxy
    # credentials before A's exec can heartbeat: node A last saw A holding the lease (B
    # claimed on node B), finds the takeover in the store, refuses; nothing is forwarded.
    writes = [
        (PULLS, {"title": pull["title"], "body": "", "head": branch, "base": "main"}),
        (COMMENTS, {"body": "worker A is back"}),
    ]
    for url, body in writes:
        status, _, refusal = node_a.through_proxy(
            "POST", url, task=TASK, attempt_id=attempt_a["attempt_id"], body=body
        )
        assert (status, refusal["code"]) == (409, "stale_generation"), refusal
        assert refusal["current_generation"] == 2

    # A thawed: its exec's heartbeat is refused and it stops the agent (exit 75), unless
    # the agent's own next write is refused first (exit 1). Either way A ends unfinished.
    thaw(a)
    assert a.proc.wait(timeout=60) != 0
    assert not any(line.startswith("opened") for line in a.lines)
    token = {"attempt_id": attempt_a["attempt_id"], "generation": attempt_a["generation"]}
    status, late = node_a.checkpoint(TASK, **token, stage="PATCH_APPLIED")
    assert (status, late["code"]) == (409, "stale_generation")

    # The outside world: one branch at A's commit, one pull request (B's), one comment.
    assert world.branches() == {branch: a_commit}
    assert [(p["number"], p["head"]) for p in world.pulls()] == [(1, branch)]
    assert world.comments() == 1
    effects = {e["rule"]: e for e in node_a.effects(TASK)}
    events = {
        rule: [(ev["event"], ev["generation"]) for ev in effect["events"]]
        for rule, effect in effects.items()
    }
    assert events["github.git.push"] == [("pending", 1), ("completed", 1), ("replayed", 2)]
    assert events["github.pulls.create"] == [("pending", 2), ("completed", 2)]
    # The store logged A's refused writes (its lease going and its checkpoint), whichever
    # node they came through.
    refused = store.refusals(TASK)
    assert {(r.attempt_id, r.generation, r.current_generation) for r in refused} == {
        (attempt_a["attempt_id"], 1, 2)
    }
    operations = {r.operation for r in refused}
    assert "checkpoint" in operations
    assert operations & {"heartbeat", "release"}, "A's exec was told it lost the lease"
    # ... and the requests node A's proxy fenced before they reached the store: the two
    # sent above, and A's agent's own pull request when it was quicker than its exec
    # (the exit-1 case above).
    fenced_at_proxy = sorted(r.reason.split(" (rule")[0] for r in refused if r.operation == "proxy")
    assert fenced_at_proxy.count(f"POST api.github.com{COMMENTS_PATH}") == 1, fenced_at_proxy
    assert fenced_at_proxy.count(f"POST api.github.com{PULLS_PATH}") in {1, 2}, fenced_at_proxy
    assert len(fenced_at_proxy) in {2, 3}, fenced_at_proxy


def _frozen(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def test_a_sidecar_frozen_between_recording_and_sending_forwards_nothing_after_takeover(
    tmp_path: Path, store: SharedStore
):
    """SPEC §3.5 and issue 12 item 9: node A records the effect pending, then freezes
    (SIGSTOP, at the failpoint right before its last lease check) past its lease; B takes
    the task over on node B and completes the effect; A, thawed, sends nothing."""
    upstream = Child.python("sidecar.testing.upstream", stderr_path=tmp_path / "upstream.log")
    with upstream:
        upstream_url = upstream.wait_for(r"upstream ready (\S+)").group(1)
        options = {"routes": [f"api.things.test={upstream_url}"], "rules": RULES}
        freeze = {"SIDECAR_FAILPOINTS": "effect.before_send:test.things.late=stop"}
        node_a = Node.start(tmp_path / "node-a", "node-a", store.url, env=freeze, **options)
        node_b = Node.start(tmp_path / "node-b", "node-b", store.url, **options)
        try:
            url = "https://api.things.test/late/things?delay=0"
            status, a = node_a.claim(TASK, "worker-a", 3)
            assert status == 200, a
            with ThreadPoolExecutor(1) as pool:
                sent_by_a = pool.submit(
                    node_a.through_proxy, "POST", url, task=TASK,
                    attempt_id=a["attempt_id"], body={"name": "frozen"},
                )  # fmt: skip
                deadline = time.monotonic() + 30
                while not _frozen(node_a.sidecar.proc.pid):
                    assert time.monotonic() < deadline, "node A never reached the failpoint"
                    time.sleep(0.05)
                time.sleep(3.5)  # A's lease runs out while it is frozen

                status, b = node_b.claim(TASK, "worker-b", 60)
                assert (status, b["generation"]) == (200, 2), b
                status, _, created = node_b.through_proxy(
                    "POST", url, task=TASK, attempt_id=b["attempt_id"], body={"name": "frozen"}
                )
                assert status == 201, created

                os.kill(node_a.sidecar.proc.pid, signal.SIGCONT)
                status, headers, refused = sent_by_a.result(timeout=60)
            assert status in (409, 503), refused
            assert refused["code"] in ("stale_generation", "lease_expiring"), refused
            assert headers["X-Sidecar-Effect"] == "refused"
            counts = requests.get(f"{upstream_url}/_upstream/counts", timeout=10).json()
            assert counts["requests"].get("POST /late/things") == 1
            (effect,) = node_b.effects(TASK)
            assert (effect["state"], effect["generation"]) == ("completed", 2)
        finally:
            os.kill(node_a.sidecar.proc.pid, signal.SIGCONT)
            node_b.stop()
            node_a.stop()
