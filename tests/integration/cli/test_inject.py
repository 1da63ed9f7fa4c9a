"""``sidecar inject -f -`` as a real process: YAML on stdin, injected YAML on stdout."""

from __future__ import annotations

import subprocess
import sys

import yaml

from sidecar.kube.inject import JOB_END_WARNING
from tests.unit.kube.manifests import AGENT_POD, CRONJOB, FALLBACK_VERSIONS, assert_valid, load


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
    assert (
        f"sidecar inject: warning: stdin: document 1 (CronJob dependency-bumper): {JOB_END_WARNING}"
        in warnings
    )
    assert len(warnings) == 2, "and the agent's own REQUESTS_CA_BUNDLE, in document 0"


def test_a_bad_annotation_exits_non_zero_naming_document_and_annotation():
    bad = AGENT_POD.replace('effect-sidecar.io/task: "task-312"', 'effect-sidecar.io/mode: "x"')
    done = sidecar_inject(CRONJOB + "\n---\n" + bad, "-f", "-")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.startswith(
        "sidecar: stdin: document 1 (Pod coding-agent): effect-sidecar.io/mode:"
    )


def test_a_malformed_manifest_exits_2_naming_file_object_and_field_without_a_traceback(tmp_path):
    path = tmp_path / "agent.yaml"
    pod = load(AGENT_POD)
    pod["spec"]["containers"][0]["env"] = "oops"
    path.write_text(yaml.safe_dump(pod))
    done = sidecar_inject("", "-f", str(path))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == (
        f"sidecar: {path}: document 0 (Pod coding-agent): spec.containers[0].env: "
        "expected a list, got a string\n"
    )


def test_yaml_nested_100k_deep_exits_2_without_a_traceback():
    done = sidecar_inject("a: " + "[" * 100_000 + "]" * 100_000 + "\n", "-f", "-")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("sidecar: stdin: nested too deeply")
    assert "Traceback" not in done.stderr


def test_a_host_network_pod_exits_2_naming_file_and_object():
    pod = AGENT_POD.replace(
        "  restartPolicy: Never\n", "  restartPolicy: Never\n  hostNetwork: true\n"
    )
    done = sidecar_inject(pod, "-f", "-")
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("sidecar: stdin: document 0 (Pod coding-agent): hostNetwork")
