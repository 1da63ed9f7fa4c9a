"""The seed's failure-injection matrix rows that concern git and GitHub, one test each.

Every test runs the unmodified demo agent (model, git CLI, PyGithub) under `sidecar exec`
against the GitHub emulator, kills what the row says with a real SIGKILL (or freezes it,
or takes the store away), restarts, and counts the outside world on the emulator.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from contextlib import closing

import pytest

pytestmark = pytest.mark.acceptance


def finished(world, worker: str, **kw):
    agent = world.agent(worker, **kw)
    agent.wait_for("^done ", timeout=90)
    assert agent.proc.wait(timeout=30) == 0
    return agent


def test_read_repository_process_kill_mid_read(make_world):
    world = make_world(model_thinking_s=1.0)
    a = world.agent("worker-a")
    a.wait_for("^read ")  # killed while it reads on: before the model has answered
    a.kill_group()
    finished(world, "worker-b")
    assert len(world.branches()) == 1
    assert len(world.pulls()) == 1


def test_generate_patch_oom_during_inference(make_world):
    world = make_world(model_thinking_s=1.5)
    a = world.agent("worker-a")
    a.wait_for("^read ")
    time.sleep(0.5)  # the model call is in flight
    a.kill_group()
    b = finished(world, "worker-b")
    (model,) = [e for e in world.effects() if e["rule"] == "openai.chat.completions"]
    # The sidecar kept the answer A never saw; B got that same patch from the log.
    assert [ev["event"] for ev in model["events"]][:2] == ["pending", "completed"]
    assert "replayed" in [ev["event"] for ev in model["events"]]
    (branch,) = world.branches()
    assert any(branch in line for line in b.lines)
    assert len(world.pulls()) == 1


def test_kill_after_git_push_before_checkpoint_write(make_world):
    world = make_world()
    a = world.agent("worker-a")
    pushed = a.wait_for(r"^pushed (\S+) (\w+)")
    a.kill_group()
    b = finished(world, "worker-b")
    branch, first_commit = pushed.group(1, 2)
    assert any("the first push stands" in line for line in b.lines)
    assert world.branches() == {branch: world.branches()[branch]}
    assert world.branches()[branch].startswith(first_commit), "the remote kept A's commit"
    (pull,) = world.pulls()
    assert pull["head"] == branch


def test_kill_after_api_201_before_checkpoint_write(make_world):
    world = make_world()
    a = world.agent("worker-a")
    a.wait_for("^opened PR #1")
    a.kill_group()
    b = finished(world, "worker-b")
    assert any(line.startswith("opened PR #1 ") for line in b.lines)
    assert len(world.pulls()) == 1
    (pr,) = [e for e in world.effects() if e["rule"] == "github.pulls.create"]
    assert [ev["event"] for ev in pr["events"]] == ["pending", "completed", "replayed"]


def test_sidecar_killed_after_api_201_before_recording_it(make_world, quick_rules):
    world = make_world(
        rules=quick_rules,
        sidecar_env={"SIDECAR_FAILPOINTS": "effect.after_upstream:github.pulls.create"},
    )
    a = world.agent("worker-a")
    assert world.sidecar.proc.wait(timeout=90) == -signal.SIGKILL
    a.proc.wait(timeout=30)
    assert len(world.pulls()) == 1, "the pull request was created before the sidecar died"
    world.start_sidecar()
    finished(world, "worker-b")
    assert len(world.pulls()) == 1
    (pr,) = [e for e in world.effects() if e["rule"] == "github.pulls.create"]
    assert "probed" in [ev["event"] for ev in pr["events"]]


def test_api_timeout_unknown_whether_201_was_received(make_world, quick_rules):
    world = make_world(rules=quick_rules, late=["POST:/repos/acme/app/pulls=4"])
    a = world.agent("worker-a")
    a.proc.wait(timeout=90)  # PyGithub got a 504 from the sidecar and gave up
    assert len(world.pulls()) == 1, "GitHub created it; only the answer was late"
    finished(world, "worker-b")
    assert len(world.pulls()) == 1
    (pr,) = [e for e in world.effects() if e["rule"] == "github.pulls.create"]
    events = [ev["event"] for ev in pr["events"]]
    assert events[:2] == ["pending", "unknown"]
    # The 201 that came after the 504 was still recorded (SPEC §3.8) - or, had it not
    # come before B asked, B's probe would have found the PR: either way, evidence.
    late = [ev for ev in pr["events"] if ev["event"] == "completed"]
    assert "probed" in events or "after the agent was told" in (late[0]["detail"] or "")


def test_lease_expiry_while_worker_is_slow(make_world):
    world = make_world()
    a = world.agent("worker-a")
    a.wait_for("^pushed ")
    os.killpg(a.pid, signal.SIGSTOP)  # A and its agent stall; its lease runs out
    try:
        time.sleep(4.5)
        finished(world, "worker-b")
        prs = len(world.pulls())
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    assert a.proc.wait(timeout=60) == 75, "A's exec learns it lost the lease and stops"
    assert prs == 1
    assert len(world.pulls()) == 1, "nothing A tried after the takeover reached GitHub"
    assert len(world.branches()) == 1


def test_checkpoint_store_temporarily_unavailable(make_world):
    world = make_world()
    a = world.agent("worker-a")
    a.wait_for("^generated ")
    with closing(
        sqlite3.connect(world.root / "sidecar" / "effects.db", isolation_level=None)
    ) as db:
        db.execute("BEGIN EXCLUSIVE")  # the store goes away before the push
        a.proc.wait(timeout=90)
        assert world.branches() == {}, "no push was forwarded without its record"
        db.execute("ROLLBACK")
    refusals = [
        line
        for line in (world.root / "sidecar-1.log").read_text().splitlines()
        if '"code":"store_unavailable"' in line and '"rule":"github.git.push"' in line
    ]
    assert refusals, "the push was refused with 503 store_unavailable"
    finished(world, "worker-b")
    assert len(world.branches()) == 1
    assert len(world.pulls()) == 1


def test_a_divergent_second_push_is_refused_with_a_message_git_prints(make_world, tmp_path):
    world = make_world()
    repo = tmp_path / "work"
    git = ["git", "-c", "user.name=A", "-c", "user.email=a@example.com", "-C", str(repo)]
    script = tmp_path / "push.sh"
    script.write_text(
        "set -e\n"
        f"rm -rf {repo} && git clone -q https://github.com/acme/app.git {repo}\n"
        f"{' '.join(git)} checkout -q -b agent/312\n"
        f'echo "$1" > {repo}/app.py\n'
        f'{" ".join(git)} commit -qam "$1"\n'
        f"{' '.join(git)} push --force origin agent/312 2>&1\n"
    )
    first = world.command("worker-a", "bash", str(script), "validate input")
    assert first.proc.wait(timeout=60) == 0
    (first_sha,) = world.branches().values()
    second = world.command("worker-b", "bash", str(script), "something else entirely")
    assert second.proc.wait(timeout=60) != 0
    output = "\n".join(second.lines)
    assert "[remote rejected]" in output
    assert "effect-sidecar" in output
    assert world.branches() == {"agent/312": first_sha}


def test_sidecar_killed_after_the_push_landed_before_recording_it(make_world, quick_rules):
    world = make_world(
        rules=quick_rules,
        sidecar_env={"SIDECAR_FAILPOINTS": "effect.after_upstream:github.git.push"},
    )
    world.agent("worker-a")
    assert world.sidecar.proc.wait(timeout=90) == -signal.SIGKILL
    (landed,) = world.branches().items()
    world.start_sidecar()
    finished(world, "worker-b")
    # B's push was not sent: the refs the repository advertises showed A's push had landed.
    assert world.branches() == dict([landed])
    (push,) = [e for e in world.effects() if e["rule"] == "github.git.push"]
    assert "probed" in [ev["event"] for ev in push["events"]]
    assert len(world.pulls()) == 1


def test_a_stale_workers_push_after_takeover_is_refused_and_never_reaches_github(make_world):
    world = make_world(model_thinking_s=0.5)
    a = world.agent("worker-a")
    a.wait_for("^read ")
    os.killpg(a.pid, signal.SIGSTOP)  # stalls before its model call and its push
    try:
        time.sleep(4.5)
        finished(world, "worker-b")
        after_b = world.branches()
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    assert a.proc.wait(timeout=60) == 75
    assert world.branches() == after_b, "A's push after the takeover reached nothing"
    assert len(world.pulls()) == 1
