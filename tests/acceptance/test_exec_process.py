"""`sidecar exec` as a user runs it: a real `sidecar serve`, real agents, real ends.

Each attempt's end is recorded (exit status, signal, command not found, lease lost) and
`sidecar tasks` shows it; exec says on stderr what it claimed, whom it waits for and how
the attempt ended; the agent gets its last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.acceptance.conftest import run_sidecar as sidecar

pytestmark = pytest.mark.acceptance


def run_exec(url: str, task: str, *agent: str, flags: tuple[str, ...] = ()):
    return sidecar("exec", "--control", url, "--task", task, *flags, "--", *agent)


def python_agent(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def exec_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("sidecar exec: ")]


def shown(data: Path, task: str) -> tuple[str, dict]:
    table = sidecar("tasks", task, "--data-dir", str(data))
    assert table.returncode == 0, table.stderr
    as_json = sidecar("tasks", task, "--json", "--data-dir", str(data))
    assert as_json.returncode == 0, as_json.stderr
    return table.stdout, json.loads(as_json.stdout)


def test_each_end_is_recorded_and_shown_by_tasks(sidecar_process):
    _, url, data = sidecar_process
    three = run_exec(url, "t-exit", *python_agent("import sys; sys.exit(3)"))
    killed = run_exec(url, "t-kill", *python_agent("import os; os.kill(os.getpid(), 9)"))
    missing = run_exec(url, "t-missing", "no-such-agent-command-7f3a", "--flag")
    fine = run_exec(url, "t-ok", *python_agent("pass"))

    assert three.returncode == 3, three.stderr
    assert killed.returncode == 128 + 9, killed.stderr
    assert missing.returncode == 127, missing.stderr
    assert "no-such-agent-command-7f3a: command not found" in missing.stderr
    assert fine.returncode == 0, fine.stderr

    for task, run, how, exit_ in (
        ("t-exit", three, "exit 3", {"exit_code": 3, "signal": None, "error": None}),
        (
            "t-kill",
            killed,
            "killed by SIGKILL",
            {"exit_code": None, "signal": "SIGKILL", "error": None},
        ),
        (
            "t-missing",
            missing,
            "command not found (127)",
            {"exit_code": 127, "signal": None, "error": "command not found"},
        ),
        ("t-ok", fine, "exit 0", {"exit_code": 0, "signal": None, "error": None}),
    ):
        table, as_json = shown(data, task)
        [attempt] = as_json["attempts"]
        assert attempt["how"] == how
        assert attempt["exit"] == exit_ | {"lease_lost": False}
        assert attempt["end_reason"] == "released"
        assert how in table
        lines = exec_lines(run.stderr)
        claim, summary = lines[0], lines[-1]
        assert len(lines) == (3 if task == "t-missing" else 2), run.stderr
        assert claim == (
            f"sidecar exec: claimed task {task}: attempt {attempt['attempt_id']}, "
            f"generation 1, worker {attempt['worker']}, last checkpoint none"
        )
        assert summary == (
            f"sidecar exec: attempt {attempt['attempt_id']} of task {task} ended: {how}; "
            "effects: 0 recorded, 0 replayed, 0 refused, 0 blocked"
        )


def test_the_agent_resumes_from_the_last_checkpoint(sidecar_process, tmp_path):
    _, url, data = sidecar_process
    first = post(f"{url}/v1/tasks/312/claim", {"worker": "worker-a", "ttl_s": 60})
    token = {"attempt_id": first["attempt_id"], "generation": first["generation"]}
    post(
        f"{url}/v1/tasks/312/checkpoints",
        token | {"stage": "PATCH_GENERATED", "outputs": {"patch_hash": "abc123"}},
    )
    post(f"{url}/v1/tasks/312/release", token)
    agent = (
        "import json, os; path = os.environ['SIDECAR_LAST_CHECKPOINT']; print(json.dumps("
        "{'stage': os.environ['SIDECAR_LAST_STAGE'], 'path': path, "
        "'checkpoint': json.load(open(path)), 'mode': oct(os.stat(path).st_mode & 0o777), "
        "'attempt': os.environ['SIDECAR_ATTEMPT_ID'], 'gen': os.environ['SIDECAR_GENERATION']}))"
    )
    resumed = run_exec(url, "312", *python_agent(agent), flags=("--worker", "worker-a"))
    assert resumed.returncode == 0, resumed.stderr
    seen = json.loads(resumed.stdout)
    assert seen["stage"] == "PATCH_GENERATED"
    assert seen["checkpoint"]["outputs"] == {"patch_hash": "abc123"}
    assert (seen["checkpoint"]["seq"], seen["checkpoint"]["generation"]) == (1, 1)
    assert seen["gen"] == "2"
    assert seen["mode"] == "0o600"
    assert not os.path.exists(seen["path"]), "the private copy is removed after"
    assert not os.path.exists(os.path.dirname(seen["path"]))
    claim = exec_lines(resumed.stderr)[0]
    assert claim == (
        f"sidecar exec: claimed task 312: attempt {seen['attempt']}, generation 2, "
        "worker worker-a, last checkpoint PATCH_GENERATED (seq 1)"
    )
    _, as_json = shown(data, "312")
    assert [a["how"] for a in as_json["attempts"]] == ["released", "exit 0"]


def test_waiting_for_a_held_lease_says_who_holds_it(sidecar_process):
    _, url, _ = sidecar_process
    post(f"{url}/v1/tasks/t-held/claim", {"worker": "worker-b", "ttl_s": 60})
    started = time.monotonic()
    waited = run_exec(
        url, "t-held", *python_agent("pass"), flags=("--worker", "worker-a", "--wait-s", "9")
    )
    took = time.monotonic() - started
    assert waited.returncode == 4, waited.stderr  # SPEC §5: held by another live worker
    assert took >= 9
    lines = exec_lines(waited.stderr)
    assert len(lines) >= 2, waited.stderr  # at the start, then every few seconds
    assert all("task t-held is held by worker worker-b" in line for line in lines)
    assert all(" until 20" in line and "waiting (up to" in line for line in lines)
    assert "leased to worker 'worker-b'" in waited.stderr


def test_quiet_prints_no_exec_lines(sidecar_process):
    _, url, data = sidecar_process
    quiet = run_exec(url, "t-quiet", *python_agent("import sys; sys.exit(3)"), flags=("--quiet",))
    assert quiet.returncode == 3
    assert exec_lines(quiet.stderr) == []
    assert shown(data, "t-quiet")[1]["attempts"][0]["how"] == "exit 3"


def test_a_lost_lease_is_recorded_as_lease_lost(sidecar_process, tmp_path):
    _, url, data = sidecar_process
    ready = tmp_path / "ready"
    touch = f"pathlib.Path({str(ready)!r}).touch()"
    agent = python_agent(f"import pathlib, time; {touch}; time.sleep(60)")
    execs = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "exec",
            "--control",
            url,
            "--task",
            "t-lost",
            "--worker",
            "worker-a",
            "--lease-ttl-s",
            "3",
            "--",
            *agent,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            assert time.monotonic() < deadline, "the agent never started"
            time.sleep(0.1)
        # The same worker claims again: the running attempt is superseded.
        post(f"{url}/v1/tasks/t-lost/claim", {"worker": "worker-a", "ttl_s": 60})
        _, stderr = execs.communicate(timeout=30)
    finally:
        if execs.poll() is None:
            execs.kill()
    assert execs.returncode == 75, stderr
    lines = exec_lines(stderr)
    assert lines[-1].endswith(
        "ended: lease lost (the agent was stopped: killed by SIGTERM); "
        "effects: 0 recorded, 0 replayed, 0 refused, 0 blocked"
    ), stderr
    table, as_json = shown(data, "t-lost")
    old, new = as_json["attempts"]
    assert (old["end_reason"], old["how"]) == ("superseded", "lease lost")
    assert old["exit"]["lease_lost"] is True
    assert new["how"] == "current"
    assert "lease lost" in table


def test_the_private_directory_of_a_killed_exec_is_removed_by_the_next_one(
    sidecar_process, tmp_path
):
    _, url, _ = sidecar_process
    first = post(f"{url}/v1/tasks/t-killed/claim", {"worker": "w", "ttl_s": 60})
    token = {"attempt_id": first["attempt_id"], "generation": first["generation"]}
    post(f"{url}/v1/tasks/t-killed/checkpoints", token | {"stage": "S", "outputs": {"k": "v"}})
    post(f"{url}/v1/tasks/t-killed/release", token)
    said = tmp_path / "agent.json"
    agent = (
        "import json, os, time; json.dump({'path': os.environ['SIDECAR_LAST_CHECKPOINT'], "
        f"'pid': os.getpid()}}, open({str(said)!r}, 'w')); time.sleep(120)"
    )
    killed = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "exec", "--control", url, "--task", "t-killed",
         "--", *python_agent(agent)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not (said.exists() and said.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = json.loads(said.read_text())
    finally:
        killed.kill()  # SIGKILL: the exec cannot remove its directory
        killed.wait()
    os.kill(seen["pid"], 9)  # its agent, orphaned by the kill
    folder = Path(seen["path"]).parent
    assert folder.is_dir(), "the killed exec left its private directory"
    assert json.loads(Path(seen["path"]).read_text())["outputs"] == {"k": "v"}

    after = run_exec(url, "t-after", *python_agent("pass"))

    assert after.returncode == 0, after.stderr
    assert not folder.exists(), "the next exec removed it"
