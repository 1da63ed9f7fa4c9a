"""One consistent CLI, as a user runs it: real `sidecar` processes against one real
`sidecar serve` (shared by this module), and the exit codes of SPEC §5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.testing.processes import Child
from tests.support.ports import free_port

pytestmark = pytest.mark.acceptance

AGENT = (sys.executable, "-c", "pass")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One `sidecar serve` on free ports; (control URL, data dir)."""
    root = tmp_path_factory.mktemp("cli")
    data = root / "data"
    child = Child.python(
        "sidecar", "serve", "--data-dir", str(data), "--control-listen", "127.0.0.1:0",
        "--proxy-listen", "127.0.0.1:0", stderr_path=root / "sidecar.log",
    )  # fmt: skip
    with child:
        url = child.wait_for(r"effect-sidecar ready control=(\S+)", timeout=30).group(1)
        yield url, data


def sidecar(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=clean | (env or {}),
    )


def claim(url: str, task: str, worker: str) -> None:
    request = urllib.request.Request(
        f"{url}/v1/tasks/{task}/claim",
        data=json.dumps({"worker": worker, "ttl_s": 60}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_exec_exits_4_when_another_live_worker_holds_the_lease(served):
    url, _ = served
    claim(url, "held-4", "worker-b")
    run = sidecar("exec", "--control", url, "--task", "held-4", "--worker", "worker-a", "--",
                  *AGENT)  # fmt: skip
    assert run.returncode == 4, run.stderr
    assert "task held-4 is leased to worker 'worker-b'" in run.stderr
    assert "(see --wait-s)" in run.stderr


def test_exec_control_takes_host_port(served):
    url, _ = served
    host_port = url.removeprefix("http://")
    run = sidecar("exec", "--control", host_port, "--task", "host-port", "--lease-ttl-s", "30",
                  "--", *AGENT)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "claimed task host-port" in run.stderr


def test_exec_ttl_s_still_works_and_says_it_is_deprecated(served):
    url, _ = served
    run = sidecar("exec", "--control", url, "--task", "old-ttl", "--ttl-s", "30", "--", *AGENT)
    assert run.returncode == 0, run.stderr
    assert "--ttl-s is deprecated; use --lease-ttl-s" in run.stderr


def test_exec_reads_its_control_address_from_config(served, tmp_path):
    url, _ = served
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"control_listen: {url.removeprefix('http://')}\nlease_ttl_s: 30\n")
    run = sidecar("exec", "--config", str(config), "--task", "from-config", "--", *AGENT)
    assert run.returncode == 0, run.stderr
    assert "claimed task from-config" in run.stderr


def test_exec_says_where_its_control_address_came_from_when_nothing_answers(tmp_path):
    port = free_port()
    run = sidecar("exec", "--task", "t", "--", *AGENT,
                  env={"SIDECAR_CONTROL_LISTEN": f"127.0.0.1:{port}"})  # fmt: skip
    assert run.returncode == 5, run.stderr
    assert f"no sidecar answers at http://127.0.0.1:{port}" in run.stderr
    assert "the address is SIDECAR_CONTROL_LISTEN" in run.stderr
    config = tmp_path / "sidecar.yaml"
    config.write_text(f"control_listen: 127.0.0.1:{port}\n")
    run = sidecar("exec", "--config", str(config), "--task", "t", "--", *AGENT)
    assert run.returncode == 5, run.stderr
    assert f"control_listen of the config file {config}" in run.stderr


@pytest.mark.parametrize(
    "verb",
    [
        ("tasks", "bad id"),
        ("effects", "bad/id"),
        ("exec", "--task", "bad id", "--", *AGENT),
    ],
)
def test_a_bad_task_id_exits_2(served, verb):
    url, _ = served
    run = sidecar(*verb, "--control", url)
    assert run.returncode == 2, run.stderr
    assert "is not valid" in run.stderr


def test_an_unknown_task_exits_1_with_a_clear_message(served):
    url, data = served
    through_control = sidecar("tasks", "never-claimed", "--control", url.removeprefix("http://"))
    assert through_control.returncode == 1, through_control.stderr
    assert "task never-claimed has never been claimed" in through_control.stderr
    in_store = sidecar("effects", "never-claimed", "--data-dir", str(data))
    assert in_store.returncode == 1, in_store.stderr
    assert "task never-claimed has never been claimed" in in_store.stderr


def test_no_sidecar_answering_exits_5_for_every_verb_that_reads_one():
    port = free_port()
    run = sidecar("tasks", "--control", f"127.0.0.1:{port}")
    assert run.returncode == 5, run.stderr
    assert f"no sidecar answers at http://127.0.0.1:{port}" in run.stderr


def test_a_missing_agent_command_exits_127(served):
    url, _ = served
    run = sidecar("exec", "--control", url, "--task", "missing", "--", "no-such-command-4c1e")
    assert run.returncode == 127, run.stderr
