"""``sidecar inject -f -`` as a real process: YAML on stdin, injected YAML on stdout."""

from __future__ import annotations

import subprocess
import sys

import yaml

from sidecar.kube.inject import JOB_END_WARNING
from tests.unit.kube.manifests import AGENT_POD, CRONJOB, FALLBACK_VERSIONS, assert_valid


def sidecar_inject(stdin: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "inject", *argv],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_manifests_on_stdin_come_out_injected_on_stdout():
    done = sidecar_inject(AGENT_POD + "\n---\n" + CRONJOB, "-f", "-")
    assert done.returncode == 0, done.stderr
    pod, cronjob = yaml.safe_load_all(done.stdout)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "effect-sidecar-redirect",
        "effect-sidecar",
    ]
    assert_valid(cronjob, FALLBACK_VERSIONS)


def test_a_job_without_native_sidecars_is_injected_with_a_warning_on_stderr(tmp_path):
    config = tmp_path / "inject.yaml"
    config.write_text("native_sidecar: false\n")
    done = sidecar_inject(AGENT_POD + "\n---\n" + CRONJOB, "-f", "-", "--config", str(config))
    assert done.returncode == 0, done.stderr
    _, cronjob = yaml.safe_load_all(done.stdout)
    assert cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["name"] == (
        "effect-sidecar"
    )
    warnings = done.stderr.splitlines()
    assert warnings == [f"sidecar inject: warning: stdin: document 1: {JOB_END_WARNING}"]


def test_a_bad_annotation_exits_non_zero_naming_document_and_annotation():
    bad = AGENT_POD.replace('effect-sidecar.io/task: "task-312"', 'effect-sidecar.io/mode: "x"')
    done = sidecar_inject(CRONJOB + "\n---\n" + bad, "-f", "-")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith("sidecar: stdin: document 1: effect-sidecar.io/mode:")
