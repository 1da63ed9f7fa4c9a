"""``sidecar inject``: multi-document YAML in, injected YAML out; errors name the document."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import yaml

from sidecar.cli import inject
from sidecar.errors import ConfigError, InvalidInjection
from tests.unit.kube.manifests import (
    AGENT_POD,
    DEPLOYMENT,
    INDEXED_JOB,
    JOB_PLAIN,
    NATIVE_VERSIONS,
    PARALLEL_JOB,
    assert_valid,
    job_pod,
    load,
    pod_template,
    resolved_env,
)

SERVICE = "apiVersion: v1\nkind: Service\nmetadata: {name: agent}\nspec: {ports: [{port: 80}]}\n"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    inject.register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["inject", *argv])


def run(capsys, *argv: str) -> list[dict]:
    args = parse(*argv)
    assert args.run(args) == 0
    return list(yaml.safe_load_all(capsys.readouterr().out))


def test_workloads_are_injected_and_other_documents_pass_through(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text("\n---\n".join([AGENT_POD, SERVICE, DEPLOYMENT]))
    pod, service, deployment = run(capsys, "-f", str(path))
    assert service == load(SERVICE)
    for manifest in (pod, deployment):
        assert "effect-sidecar.io/status" in pod_template(manifest)["metadata"]["annotations"]
        assert_valid(manifest, NATIVE_VERSIONS)


def test_stdin_and_files_are_read_in_order(tmp_path, capsys, monkeypatch):
    path = tmp_path / "service.yaml"
    path.write_text(SERVICE)
    monkeypatch.setattr("sys.stdin", io.StringIO(AGENT_POD))
    documents = run(capsys, "-f", "-", "-f", str(path))
    assert [d["kind"] for d in documents] == ["Pod", "Service"]


def test_items_of_a_list_are_injected(tmp_path, capsys):
    path = tmp_path / "list.yaml"
    listing = {"apiVersion": "v1", "kind": "List", "items": [load(AGENT_POD), load(SERVICE)]}
    path.write_text(yaml.safe_dump(listing))
    (document,) = run(capsys, "-f", str(path))
    pod, service = document["items"]
    assert [c["name"] for c in pod["spec"]["initContainers"]][1] == "effect-sidecar"
    assert service == load(SERVICE)


def test_the_config_file_and_namespace_are_used(tmp_path, capsys):
    config = tmp_path / "inject.yaml"
    config.write_text("image: registry.acme/sidecar:9\nnamespace: platform\n")
    path = tmp_path / "pod.yaml"
    pod = load(AGENT_POD)
    del pod["metadata"]["namespace"]
    path.write_text(yaml.safe_dump(pod))
    (injected,) = run(capsys, "-f", str(path), "--config", str(config), "--namespace", "agents")
    assert injected["spec"]["initContainers"][0]["image"] == "registry.acme/sidecar:9"
    (skipped,) = run(capsys, "-f", str(path), "--config", str(config), "--namespace", "platform")
    assert skipped == pod


def test_injecting_the_output_again_changes_nothing(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text("\n---\n".join([AGENT_POD, DEPLOYMENT]))
    once = run(capsys, "-f", str(path))
    again_path = tmp_path / "again.yaml"
    again_path.write_text(yaml.safe_dump_all(once))
    assert run(capsys, "-f", str(again_path)) == once


def test_a_bad_annotation_names_the_document_and_the_annotation(tmp_path, capsys):
    bad = load(AGENT_POD)
    bad["metadata"]["annotations"]["effect-sidecar.io/mode"] = "magic"
    path = tmp_path / "app.yaml"
    path.write_text(SERVICE + "---\n" + yaml.safe_dump(bad))
    args = parse("-f", str(path))
    with pytest.raises(InvalidInjection) as caught:
        args.run(args)
    assert caught.value.detail.startswith(
        f"{path}: document 1 (Pod coding-agent): effect-sidecar.io/mode:"
    )
    assert "'magic'" in caught.value.detail
    assert caught.value.annotation == "effect-sidecar.io/mode"
    assert capsys.readouterr().out == ""  # nothing half-written


def test_unreadable_input_is_an_error(tmp_path):
    args = parse("-f", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="cannot read"):
        args.run(args)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [\n")
    args = parse("-f", str(broken))
    with pytest.raises(ConfigError, match="not valid YAML"):
        args.run(args)


def test_the_status_annotation_survives_the_yaml_round_trip(tmp_path, capsys):
    path = tmp_path / "pod.yaml"
    path.write_text(AGENT_POD)
    (pod,) = run(capsys, "-f", str(path))
    status = json.loads(pod["metadata"]["annotations"]["effect-sidecar.io/status"])
    assert status["initContainers"] == ["effect-sidecar-redirect", "effect-sidecar"]


def refusal(tmp_path, text: str) -> str:
    path = tmp_path / "app.yaml"
    path.write_text(text)
    args = parse("-f", str(path))
    with pytest.raises(InvalidInjection) as caught:
        args.run(args)
    return caught.value.detail.replace(str(path), "app.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"].update(containers={"agent": {"image": "x"}}),
         "spec.containers: expected a list, got an object"),
        (lambda p: p["spec"]["containers"].append(None),
         "spec.containers[1]: expected an object (a container), got null"),
        (lambda p: p["spec"]["containers"][0].update(env="SSL_CERT_FILE=/x"),
         "spec.containers[0].env: expected a list, got a string"),
    ],
)  # fmt: skip
def test_a_malformed_manifest_names_the_file_the_object_and_the_field(tmp_path, change, message):
    pod = load(AGENT_POD)
    change(pod)
    detail = refusal(tmp_path, SERVICE + "---\n" + yaml.safe_dump(pod))
    assert detail == f"app.yaml: document 1 (Pod coding-agent): {message}"


def test_yaml_nested_deeper_than_any_manifest_is_refused_not_a_crash(tmp_path):
    deep = "a: " + "[" * 50_000 + "]" * 50_000 + "\n"
    assert "app.yaml: nested too deeply" in refusal(tmp_path, deep)
    deep_enough = {"kind": "ConfigMap", "data": {}}
    node = deep_enough["data"]
    for _ in range(150):  # loads, then would exhaust the stack on the way out
        node["a"] = {}
        node = node["a"]
    detail = refusal(tmp_path, yaml.safe_dump(deep_enough))
    assert detail.startswith(
        "app.yaml: document 0 (ConfigMap ?): the document is nested more than 100 levels"
    )


def test_a_list_whose_items_are_not_a_list_is_refused(tmp_path):
    detail = refusal(tmp_path, "apiVersion: v1\nkind: List\nitems: pods\n")
    assert detail == "app.yaml: document 0 (List ?): items: expected a list, got a string"


def test_a_host_network_pod_is_refused_naming_the_file_and_the_object(tmp_path):
    pod = load(AGENT_POD)
    pod["spec"]["hostNetwork"] = True
    detail = refusal(tmp_path, yaml.safe_dump(pod))
    assert detail.startswith("app.yaml: document 0 (Pod coding-agent): hostNetwork")
    assert 'effect-sidecar.io/allow-host-network: "true"' in detail


def warnings_of(capsys, path) -> list[str]:
    args = parse("-f", str(path))
    assert args.run(args) == 0
    return capsys.readouterr().err.splitlines()


def test_an_indexed_job_comes_out_with_a_task_per_index(tmp_path, capsys):
    path = tmp_path / "job.yaml"
    path.write_text(INDEXED_JOB)
    (job,) = run(capsys, "-f", str(path))
    assert_valid(job, NATIVE_VERSIONS)
    tasks = {resolved_env(job_pod(job, i), "effect-sidecar")["SIDECAR_TASK"] for i in range(5)}
    assert len(tasks) == 5


def test_warnings_name_the_file_the_object_and_what_to_do(tmp_path, capsys):
    path = tmp_path / "app.yaml"
    path.write_text("\n---\n".join([PARALLEL_JOB, AGENT_POD, JOB_PLAIN]))
    first, second = warnings_of(capsys, path)
    assert first.startswith(f"sidecar inject: warning: {path}: document 0 (Job queue-workers): ")
    assert "share one task and one lease" in first
    assert second.startswith(f"sidecar inject: warning: {path}: document 1 (Pod coding-agent): ")
    assert "container 'agent'" in second
    assert "REQUESTS_CA_BUNDLE" in second
