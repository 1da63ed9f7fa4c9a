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
    NATIVE_VERSIONS,
    assert_valid,
    load,
    pod_template,
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
    assert caught.value.detail.startswith(f"{path}: document 1: effect-sidecar.io/mode:")
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
