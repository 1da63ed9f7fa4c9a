"""`sidecar serve` and the inspection verbs as a new user runs them: real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from sidecar.store import sqlfiles
from sidecar.testing.processes import Child
from tests.acceptance.conftest import run_sidecar as sidecar

pytestmark = pytest.mark.acceptance


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


def test_serve_prints_its_address_and_stops_cleanly_on_sigterm(sidecar_process, tmp_path):
    child, url, data = sidecar_process
    with urllib.request.urlopen(f"{url}/readyz", timeout=10) as ready:
        assert json.load(ready)["store"] == {
            "backend": "sqlite",
            "schema_version": sqlfiles.migrations("sqlite")[-1].version,
            "durable": True,
        }
    assert child.terminate() == 0
    log = [json.loads(line) for line in (tmp_path / "sidecar.log").read_text().splitlines()]
    assert "sidecar stopping" in [e["msg"] for e in log]
    assert not (data / "effects.db-wal").exists(), "a clean stop checkpoints the WAL"


def test_tasks_and_effects_read_the_store_of_a_running_sidecar(sidecar_process):
    _, url, data = sidecar_process
    claim = post(f"{url}/v1/tasks/312/claim", {"worker": "worker-a", "ttl_s": 60})
    token = {"attempt_id": claim["attempt_id"], "generation": claim["generation"]}
    post(f"{url}/v1/tasks/312/checkpoints", token | {"stage": "READ_COMPLETE"})

    listing = sidecar("tasks", "--data-dir", str(data))
    assert listing.returncode == 0, listing.stderr
    assert "312" in listing.stdout
    assert "READ_COMPLETE" in listing.stdout

    as_json = json.loads(sidecar("tasks", "312", "--json", "--data-dir", str(data)).stdout)
    assert as_json["lease"]["attempt_id"] == claim["attempt_id"]
    assert [c["stage"] for c in as_json["checkpoints"]] == ["READ_COMPLETE"]

    effects = sidecar("effects", "312", "--data-dir", str(data))
    assert effects.returncode == 0, effects.stderr
    assert "no effects recorded" in effects.stdout


def test_tasks_and_effects_read_a_running_sidecar_through_its_control_api(sidecar_process):
    _, url, data = sidecar_process
    for n in range(300):
        post(f"{url}/v1/tasks/t{n:03d}/claim", {"worker": f"w{n % 3}", "ttl_s": 60})
    control = url.removeprefix("http://")  # HOST:PORT works as well as a URL

    listing = sidecar("tasks", "--control", control, "--worker", "w1", "--limit", "5")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:6]] == ["t298", "t295", "t292", "t289", "t286"]
    assert "--limit N for more" in lines[-1]
    as_json = json.loads(sidecar("tasks", "--control", url, "--json", "--limit", "2").stdout)
    assert [t["task"] for t in as_json] == ["t299", "t298"]
    assert "attempts" not in as_json[0], "a listing has no attempts: `tasks TASK` has them"

    one = sidecar("tasks", "t007", "--control", control)
    assert "t007" in one.stdout
    assert "current" in one.stdout
    assert "no effects recorded" in sidecar("effects", "t007", "--control", control).stdout
    unknown = sidecar("effects", "nope", "--control", control)
    assert unknown.returncode == 1
    assert "never been claimed" in unknown.stderr

    # `| head`: the reader has left before the table is written; the CLI ends quietly.
    shell = f"set -o pipefail; {sys.executable} -m sidecar tasks --data-dir {data} | true"
    piped = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=60, check=False
    )
    assert (piped.returncode, piped.stderr) == (0, "")


def test_inspecting_a_missing_store_or_task_is_a_clear_error(tmp_path, sidecar_process):
    missing = sidecar("tasks", "--data-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 5  # store unavailable (SPEC §5's exit codes)
    assert "no store at" in missing.stderr
    assert not (tmp_path / "nowhere").exists()
    _, _, data = sidecar_process
    unknown = sidecar("effects", "999", "--data-dir", str(data))
    assert unknown.returncode == 1
    assert "never been claimed" in unknown.stderr


def test_serve_refuses_a_public_control_api_without_a_token(tmp_path):
    refused = sidecar("serve", "--data-dir", str(tmp_path), "--control-listen", "0.0.0.0:0")
    assert refused.returncode == 2
    assert "without a token" in refused.stderr
    assert not (tmp_path / "effects.db").exists()


def test_every_verb_has_help():
    for verb in ("serve", "tasks", "effects"):
        shown = sidecar(verb, "--help")
        assert shown.returncode == 0
        assert f"usage: sidecar {verb}" in shown.stdout


def test_a_second_sidecar_on_a_taken_port_says_so(sidecar_process, tmp_path):
    _, url, _ = sidecar_process
    port = url.rsplit(":", 1)[1]
    child = Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(tmp_path / "b"),
        "--control-listen",
        f"127.0.0.1:{port}",
        stderr_path=tmp_path / "b.log",
    )
    with child:
        assert child.proc.wait(timeout=30) == 2
    assert "cannot listen" in (tmp_path / "b.log").read_text()
