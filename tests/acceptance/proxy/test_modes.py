"""Start-up refusals and the other ways of wiring an agent: reverse proxy, --task."""

from __future__ import annotations

import subprocess
import sys

import pytest
import requests

pytestmark = pytest.mark.acceptance


def test_serve_refuses_to_start_on_a_broken_rule_file_naming_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rules:\n"
        "  - name: ok.rule\n"
        "    match: {host: a.test, method: POST}\n"
        "    effect: non_idempotent\n"
        "  - name: broken\n"
        "    match: {host: a.test, paht: /x}\n"
        "    effect: non_idempotent\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--rules",
            str(bad),
            "--control-listen",
            "127.0.0.1:0",
            "--proxy-listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"{bad}:6:" in done.stderr
    assert "paht" in done.stderr
    assert not (tmp_path / "d" / "effects.db").exists(), "refused before opening the store"


def test_reverse_mode_with_the_sidecar_holding_the_task_itself(make_stack):
    stack = make_stack(
        sidecar_args=[
            "--mode",
            "reverse:https://api.things.test",
            "--task",
            "rev",
            "--worker",
            "pod-1",
        ]
    )
    url = f"{stack.proxy_url}/repos/acme/app/things"
    assert stack.wait_for_lease("rev")["worker"] == "pod-1"
    first = requests.post(url, json={"name": "reversed"}, timeout=30)
    second = requests.post(url, json={"name": "reversed"}, timeout=30)
    assert (first.status_code, first.headers["X-Sidecar-Effect"]) == (201, "recorded")
    assert second.headers["X-Sidecar-Effect"] == "replayed"
    assert stack.counts()["things"] == 1
