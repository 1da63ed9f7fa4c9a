"""Injection of real-world manifests: valid for Kubernetes, complete, idempotent, whole or
not at all."""

from __future__ import annotations

import copy
import json

import pytest

from sidecar.errors import InvalidInjection
from sidecar.kube.config import InjectConfig
from sidecar.kube.containers import BUNDLE
from sidecar.kube.inject import JOB_END_WARNING, inject
from sidecar.trust import TRUST_VARIABLES
from tests.unit.kube.manifests import (
    AGENT_POD,
    ALL,
    CRONJOB,
    DEPLOYMENT,
    FALLBACK_VERSIONS,
    JOB_PLAIN,
    JOB_WITH_INIT,
    NATIVE_VERSIONS,
    POD_WITH_OTHER_SIDECAR,
    STATEFULSET,
    assert_valid,
    env_of,
    load,
    named,
    pod_template,
)

CONFIG = InjectConfig()


def injected(text: str, namespace: str = "agents", config: InjectConfig = CONFIG) -> dict:
    outcome = inject(load(text), namespace, config)
    assert outcome.injected, outcome.reason
    return outcome.manifest


def status(manifest: dict) -> dict:
    return json.loads(pod_template(manifest)["metadata"]["annotations"]["effect-sidecar.io/status"])


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_real_world_manifest_is_injected_into_a_valid_object(name):
    manifest = injected(ALL[name])
    native = status(manifest)["nativeSidecar"]
    assert_valid(manifest, NATIVE_VERSIONS if native else FALLBACK_VERSIONS)


def test_the_sidecar_is_a_native_sidecar_after_the_redirect_and_before_the_pods_init_containers():
    pod = pod_template(injected(JOB_WITH_INIT))
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == [
        "effect-sidecar-redirect",
        "effect-sidecar",
        "clone",
    ]
    assert [c["name"] for c in spec["containers"]] == ["agent"]
    sidecar = named(pod, "effect-sidecar")
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": 7300}
    assert sidecar["image"] == "ghcr.io/effect-sidecar/effect-sidecar:0.1.0"
    assert "lifecycle" not in sidecar


def test_the_sidecar_serves_transparently_on_loopback_with_a_token_and_the_store_secret():
    sidecar = named(pod_template(injected(AGENT_POD)), "effect-sidecar")
    command = sidecar["command"]
    assert command[:2] == ["sidecar", "serve"]
    flags = dict(zip(command[2::2], command[3::2], strict=True))
    assert flags == {
        "--mode": "transparent",
        "--data-dir": "/var/run/effect-sidecar",
        "--ca-bundle": "/var/run/effect-sidecar-trust/ca-bundle.pem",
        "--control-listen": "0.0.0.0:7300",
        "--control-token-file": "/etc/effect-sidecar/control/token",
        "--proxy-listen": "127.0.0.1:7301",
        "--pg-listen": "127.0.0.1:7302",
    }
    env = env_of(sidecar)
    assert env["SIDECAR_TASK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['effect-sidecar.io/task']"}
    }
    assert env["SIDECAR_WORKER"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["SIDECAR_STORE"] == {"secretKeyRef": {"name": "effect-sidecar-store", "key": "url"}}
    assert sidecar["securityContext"] == {
        "runAsUser": 1337,
        "runAsGroup": 1337,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_redirect_container_gets_the_validated_annotations_and_only_network_privileges():
    pod = pod_template(injected(STATEFULSET))
    redirect = named(pod, "effect-sidecar-redirect")
    assert redirect["command"] == [
        "sidecar", "redirect", "--proxy-port", "7301", "--pg-port", "7302",
        "--owner-uid", "1337", "--pg-ports", "5432,6432",
        "--exclude-cidrs", "10.96.0.0/12,169.254.169.254/32",
        "--include-ports", "80,443,8443",
    ]  # fmt: skip
    assert redirect["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
    }
    sidecar = named(pod, "effect-sidecar")
    command = sidecar["command"]
    assert command[command.index("--pg-upstream") + 1] == (
        "postgresql://postgres.db.svc:5432?sslmode=require"
    )
    assert command[command.index("--rules") + 1] == "/etc/effect-sidecar/rules"
    assert {"name": "effect-sidecar-rules", "configMap": {"name": "research-rules"}} in pod["spec"][
        "volumes"
    ]


def test_without_a_postgresql_upstream_no_port_is_redirected_to_a_relay_that_does_not_run():
    redirect = named(pod_template(injected(AGENT_POD)), "effect-sidecar-redirect")
    command = redirect["command"]
    assert command[command.index("--pg-ports") + 1] == ""
    assert (
        "--pg-upstream" not in named(pod_template(injected(AGENT_POD)), "effect-sidecar")["command"]
    )


def test_every_app_container_trusts_the_bundle_but_keeps_a_variable_it_sets_itself():
    manifest = injected(AGENT_POD)
    agent = named(pod_template(manifest), "agent")
    env = env_of(agent)
    assert env["REQUESTS_CA_BUNDLE"] == "/etc/ssl/corp.pem"
    for name in set(TRUST_VARIABLES) - {"REQUESTS_CA_BUNDLE"}:
        assert env[name] == BUNDLE
    assert env["OPENAI_API_KEY"] == {"secretKeyRef": {"name": "openai", "key": "key"}}
    assert {
        "name": "effect-sidecar-trust",
        "mountPath": "/var/run/effect-sidecar-trust",
        "readOnly": True,
    } in agent["volumeMounts"]
    assert status(manifest)["keptEnv"] == {"agent": ["REQUESTS_CA_BUNDLE"]}


@pytest.mark.parametrize("name", sorted(ALL))
def test_no_app_container_mounts_the_sidecars_data_where_the_ca_key_lives(name):
    pod = pod_template(injected(ALL[name]))
    spec = pod["spec"]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        volumes = {mount["name"] for mount in container.get("volumeMounts", [])}
        if container["name"] == "effect-sidecar":
            assert {"effect-sidecar-data", "effect-sidecar-trust"} <= volumes
        else:
            assert "effect-sidecar-data" not in volumes, container["name"]
    assert BUNDLE.startswith("/var/run/effect-sidecar-trust/")


def test_native_sidecars_serve_the_pods_own_init_containers_too():
    pod = pod_template(injected(JOB_WITH_INIT))
    assert env_of(named(pod, "clone"))["GIT_SSL_CAINFO"] == BUNDLE


def test_env_proxy_mode_needs_no_privilege_and_points_the_apps_at_the_proxy():
    manifest = injected(DEPLOYMENT)
    pod = pod_template(manifest)
    names = [c["name"] for c in pod["spec"]["initContainers"]]
    assert names == ["effect-sidecar"]
    command = named(pod, "effect-sidecar")["command"]
    assert command[command.index("--mode") + 1] == "regular"
    for app in ("bot", "metrics"):
        env = env_of(named(pod, app))
        for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
            assert env[variable] == "http://127.0.0.1:7301"
        assert env["no_proxy"] == "127.0.0.1,localhost,::1"
        assert "DATABASE_URL" not in env
    assert env_of(named(pod, "bot"))["NO_PROXY"] == "internal.acme"
    assert env_of(named(pod, "metrics"))["NO_PROXY"] == "127.0.0.1,localhost,::1"


def test_fallback_puts_the_sidecar_first_and_holds_the_app_until_it_is_ready():
    manifest = injected(CRONJOB)
    pod = pod_template(manifest)
    spec = pod["spec"]
    assert [c["name"] for c in spec["containers"]] == ["effect-sidecar", "bumper"]
    assert [c["name"] for c in spec["initContainers"]] == ["effect-sidecar-redirect"]
    sidecar = spec["containers"][0]
    assert "restartPolicy" not in sidecar
    hook = sidecar["lifecycle"]["postStart"]["exec"]["command"]
    assert hook[:2] == ["python", "-c"]
    assert "/readyz" in hook[2]
    assert status(manifest)["containers"] == ["effect-sidecar"]


def test_fallback_leaves_the_pods_init_containers_untouched_and_before_the_redirect():
    text = JOB_WITH_INIT.replace(
        'annotations: {effect-sidecar.io/inject: "true"}',
        'annotations: {effect-sidecar.io/inject: "true", '
        'effect-sidecar.io/native-sidecar: "false"}',
    )
    manifest = injected(text)
    assert_valid(manifest, FALLBACK_VERSIONS)
    pod = pod_template(manifest)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "clone",
        "effect-sidecar-redirect",
    ]
    clone = named(pod, "clone")
    assert clone == pod_template(load(JOB_WITH_INIT))["spec"]["initContainers"][0]


def test_a_job_in_the_fallback_shape_is_warned_how_it_will_end():
    fallback = InjectConfig(native_sidecar=False)
    for text in (JOB_PLAIN, CRONJOB):
        outcome = inject(load(text), "agents", fallback)
        assert outcome.warnings == (JOB_END_WARNING,)
        assert "/v1/shutdown" in JOB_END_WARNING
        assert len(JOB_END_WARNING) < 256, "the API server may cut longer warnings"
    # What the webhook sees: the pod the Job controller made, owned by the Job.
    pod = load(AGENT_POD)
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "agent-312", "uid": "u-1"}
    ]
    assert inject(pod, "agents", fallback).warnings == (JOB_END_WARNING,)
    # Native sidecars end with the agent; other workloads do not end at all.
    assert inject(load(JOB_PLAIN), "agents", CONFIG).warnings == ()
    assert inject(load(DEPLOYMENT), "agents", fallback).warnings == ()


def test_a_job_pod_with_only_the_prefixed_job_label_takes_its_task_from_it():
    pod = load(AGENT_POD)
    del pod["metadata"]["annotations"]["effect-sidecar.io/task"]
    pod["metadata"].setdefault("labels", {})["batch.kubernetes.io/job-name"] = "agent-312"
    sidecar = named(inject(pod, "agents", CONFIG).manifest, "effect-sidecar")
    task = next(item for item in sidecar["env"] if item["name"] == "SIDECAR_TASK")
    assert task["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']"
    )


def test_config_native_sidecar_false_is_the_cluster_wide_fallback():
    config = InjectConfig(native_sidecar=False)
    manifest = injected(JOB_PLAIN, config=config)
    first = pod_template(manifest)["spec"]["containers"][0]
    assert first["name"] == "effect-sidecar"
    assert_valid(manifest, FALLBACK_VERSIONS)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (AGENT_POD, "metadata.annotations['effect-sidecar.io/task']"),
        (JOB_PLAIN, "metadata.labels['job-name']"),
        (CRONJOB, "metadata.labels['job-name']"),
        (STATEFULSET, "metadata.name"),
    ],
)
def test_the_task_comes_from_the_annotation_else_the_job_else_the_pod_name(text, field):
    manifest = injected(text)
    env = env_of(named(pod_template(manifest), "effect-sidecar"))
    assert env["SIDECAR_TASK"] == {"fieldRef": {"fieldPath": field}}
    assert status(manifest)["task"] == field


def test_a_pod_of_a_job_admitted_by_the_webhook_is_bound_to_its_job():
    pod = load(AGENT_POD)
    del pod["metadata"]["annotations"]["effect-sidecar.io/task"]
    pod["metadata"]["labels"]["job-name"] = "nightly-29111"
    env = env_of(named(inject(pod, "agents", CONFIG).manifest, "effect-sidecar"))
    assert env["SIDECAR_TASK"] == {"fieldRef": {"fieldPath": "metadata.labels['job-name']"}}


def test_the_pods_own_native_sidecar_stays_and_comes_after_ours():
    pod = pod_template(injected(POD_WITH_OTHER_SIDECAR))
    assert [c["name"] for c in pod["spec"]["initContainers"]] == [
        "effect-sidecar-redirect",
        "effect-sidecar",
        "fluent-bit",
    ]
    assert env_of(named(pod, "agent"))["SSL_CERT_FILE"] == "/etc/ssl/certs/ca-certificates.crt"


def test_the_status_annotation_says_what_was_added():
    assert status(injected(STATEFULSET)) == {
        "version": "0.1.0",
        "mode": "transparent",
        "nativeSidecar": True,
        "initContainers": ["effect-sidecar-redirect", "effect-sidecar"],
        "containers": [],
        "volumes": [
            "effect-sidecar-data",
            "effect-sidecar-trust",
            "effect-sidecar-control-token",
            "effect-sidecar-rules",
        ],
        "task": "metadata.name",
    }


@pytest.mark.parametrize("name", sorted(ALL))
def test_injecting_twice_is_injecting_once(name):
    once = injected(ALL[name])
    again = inject(once, "agents", CONFIG)
    assert not again.injected
    assert again.reason == "already injected"
    assert again.manifest == once


def test_the_input_manifest_is_not_modified():
    original = load(JOB_WITH_INIT)
    before = copy.deepcopy(original)
    inject(original, "agents", CONFIG)
    assert original == before


@pytest.mark.parametrize(
    ("change", "namespace", "reason"),
    [
        (lambda m: m["metadata"]["annotations"].pop("effect-sidecar.io/inject"), "agents",
         "not opted in"),
        (lambda m: m["metadata"]["annotations"].update({"effect-sidecar.io/inject": "false"}),
         "agents", "not opted in"),
        (lambda m: m["spec"].update({"hostNetwork": True}), "agents", "hostNetwork pod"),
        (lambda m: None, "kube-system", "namespace kube-system is skipped"),
        (lambda m: None, "kube-public", "namespace kube-public is skipped"),
        (lambda m: None, "kube-node-lease", "namespace kube-node-lease is skipped"),
        (lambda m: None, "effect-sidecar", "namespace effect-sidecar is skipped"),
    ],
)  # fmt: skip
def test_pods_that_do_not_opt_in_or_must_not_be_touched_come_back_unchanged(
    change, namespace, reason
):
    manifest = load(AGENT_POD)
    change(manifest)
    outcome = inject(manifest, namespace, CONFIG)
    assert (outcome.injected, outcome.reason) == (False, reason)
    assert outcome.manifest == manifest


@pytest.mark.parametrize(
    "document",
    [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}},
    ],
)
def test_documents_that_are_not_workloads_pass_through(document):
    outcome = inject(document, "agents", CONFIG)
    assert (outcome.injected, outcome.manifest) == (False, document)


def test_a_container_already_named_effect_sidecar_without_status_is_an_error():
    manifest = load(AGENT_POD)
    manifest["spec"]["containers"].append({"name": "effect-sidecar", "image": "x"})
    with pytest.raises(InvalidInjection, match="already has a container named 'effect-sidecar'"):
        inject(manifest, "agents", CONFIG)


def test_a_volume_name_clash_is_an_error():
    manifest = load(AGENT_POD)
    manifest["spec"]["volumes"].append({"name": "effect-sidecar-data", "emptyDir": {}})
    with pytest.raises(InvalidInjection, match="volume named 'effect-sidecar-data'"):
        inject(manifest, "agents", CONFIG)


@pytest.mark.parametrize(
    ("annotation", "value", "message"),
    [
        ("inject", "yes", 'effect-sidecar.io/inject: expected "true" or "false", got \'yes\''),
        ("mode", "sidecar", 'effect-sidecar.io/mode: expected "transparent" or "env-proxy"'),
        ("native-sidecar", "maybe", "effect-sidecar.io/native-sidecar: expected"),
        ("exclude-outbound-cidrs", "10.0.0.0/33", "'10.0.0.0/33' is not a CIDR"),
        ("include-outbound-cidrs", "10.0.0.1/8", "'10.0.0.1/8' is not a CIDR"),
        ("exclude-outbound-ports", "22,70000", "'70000' is not a port (1-65535)"),
        ("include-outbound-ports", "http", "'http' is not a port"),
        ("exclude-outbound-ports", "0", "'0' is not a port"),
        ("pg-ports", "5432", "effect-sidecar.io/pg-ports: set, but effect-sidecar.io/pg-upstream"),
        ("pg-upstream", "mysql://db:3306", "expected postgresql://HOST:PORT"),
        ("pg-upstream", "postgresql://db:99999", "bad port"),
        ("rules-configmap", "My_Rules", "'My_Rules' is not a valid object name"),
        ("task", " ", "the task id is empty"),
    ],
)
def test_a_bad_annotation_is_an_error_naming_it_and_its_value(annotation, value, message):
    manifest = load(AGENT_POD)
    manifest["metadata"]["annotations"][f"effect-sidecar.io/{annotation}"] = value
    with pytest.raises(InvalidInjection, match=None) as caught:
        inject(manifest, "agents", CONFIG)
    assert message in caught.value.detail
    assert caught.value.annotation == f"effect-sidecar.io/{annotation}"


def test_the_configuration_sets_image_user_resources_and_secrets():
    config = InjectConfig.model_validate(
        {
            "image": "registry.acme/effect-sidecar:dev",
            "image_pull_policy": "Always",
            "run_as_user": 2000,
            "resources": {"limits": {"memory": "1Gi"}},
            "control_token_secret": {"name": "ctl", "key": "t"},
            "store_secret": None,
            "rules_configmap": "team-rules",
        }
    )
    manifest = injected(AGENT_POD, config=config)
    assert_valid(manifest, NATIVE_VERSIONS)
    pod = pod_template(manifest)
    sidecar = named(pod, "effect-sidecar")
    assert sidecar["image"] == "registry.acme/effect-sidecar:dev"
    assert sidecar["imagePullPolicy"] == "Always"
    assert sidecar["securityContext"]["runAsUser"] == 2000
    assert sidecar["resources"] == {"limits": {"memory": "1Gi"}}
    assert "SIDECAR_STORE" not in env_of(sidecar)
    assert "PGPASSWORD" not in env_of(sidecar)
    redirect = named(pod, "effect-sidecar-redirect")["command"]
    assert redirect[redirect.index("--owner-uid") + 1] == "2000"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["effect-sidecar-control-token"]["secret"]["secretName"] == "ctl"
    assert volumes["effect-sidecar-control-token"]["secret"]["items"] == [
        {"key": "t", "path": "token"}
    ]
    assert volumes["effect-sidecar-rules"]["configMap"] == {"name": "team-rules"}


def test_the_schema_check_itself_refuses_an_unknown_field():
    manifest = injected(AGENT_POD)
    named(manifest, "effect-sidecar")["restartPolicyy"] = "Always"
    with pytest.raises(Exception, match="restartPolicyy"):
        assert_valid(manifest, NATIVE_VERSIONS)


@pytest.mark.parametrize("path", ["/var/run/effect-sidecar/", "/var/run/effect-sidecar-trust"])
def test_an_app_mount_where_the_sidecars_volumes_go_is_an_error(path):
    manifest = load(AGENT_POD)
    manifest["spec"]["containers"][0]["volumeMounts"].append(
        {"name": "workspace", "mountPath": path}
    )
    with pytest.raises(InvalidInjection, match=f"already mounts something at {path}"):
        inject(manifest, "agents", CONFIG)


def test_the_annotation_overrides_the_label_either_way():
    manifest = load(JOB_PLAIN)  # opts in by label
    template = pod_template(manifest)
    template["metadata"]["annotations"] = {"effect-sidecar.io/inject": "false"}
    assert inject(manifest, "agents", CONFIG).reason == "not opted in"
    template["metadata"]["labels"]["effect-sidecar.io/inject"] = "false"
    template["metadata"]["annotations"] = {"effect-sidecar.io/inject": "true"}
    assert inject(manifest, "agents", CONFIG).injected


@pytest.mark.parametrize("level", ["pod", "container"])
def test_an_app_running_as_the_sidecars_uid_is_an_error_as_it_would_bypass_the_sidecar(level):
    manifest = load(AGENT_POD)
    target = manifest["spec"] if level == "pod" else manifest["spec"]["containers"][0]
    target["securityContext"] = {"runAsUser": 1337}
    with pytest.raises(InvalidInjection, match="runs as UID 1337, the sidecar's own"):
        inject(manifest, "agents", CONFIG)


def test_a_pod_in_a_skipped_namespace_is_never_refused_even_with_bad_annotations():
    manifest = load(AGENT_POD)
    manifest["metadata"]["annotations"]["effect-sidecar.io/inject"] = "yes please"
    outcome = inject(manifest, "kube-system", CONFIG)
    assert (outcome.injected, outcome.reason) == (False, "namespace kube-system is skipped")


def test_in_env_proxy_mode_the_sidecars_uid_is_no_concern():
    manifest = load(AGENT_POD)
    manifest["metadata"]["annotations"]["effect-sidecar.io/mode"] = "env-proxy"
    manifest["spec"]["securityContext"] = {"runAsUser": 1337}
    assert inject(manifest, "agents", CONFIG).injected


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_ca_secret_is_mounted_read_only_in_the_sidecar_alone_and_passed_as_ca_from(name):
    config = InjectConfig(ca_secret="team-ca")
    manifest = injected(ALL[name], config=config)
    assert_valid(
        manifest, NATIVE_VERSIONS if status(manifest)["nativeSidecar"] else FALLBACK_VERSIONS
    )
    pod = pod_template(manifest)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["effect-sidecar-ca"] == {
        "name": "effect-sidecar-ca",
        "secret": {
            "secretName": "team-ca",
            "items": [
                {"key": "tls.crt", "path": "tls.crt"},
                {"key": "tls.key", "path": "tls.key"},
            ],
            "defaultMode": 0o444,
        },
    }
    sidecar = named(pod, "effect-sidecar")
    command = sidecar["command"]
    assert command[command.index("--ca-from") + 1] == "/etc/effect-sidecar/ca"
    assert {
        "name": "effect-sidecar-ca",
        "mountPath": "/etc/effect-sidecar/ca",
        "readOnly": True,
    } in sidecar["volumeMounts"]
    spec = pod["spec"]
    others = [
        c
        for c in [*(spec.get("initContainers") or []), *spec["containers"]]
        if c["name"] != "effect-sidecar"
    ]
    assert others
    for container in others:
        assert all(m["name"] != "effect-sidecar-ca" for m in container.get("volumeMounts") or [])
    assert "effect-sidecar-ca" in status(manifest)["volumes"]


def test_without_a_ca_secret_the_sidecar_makes_its_own_ca():
    pod = pod_template(injected(AGENT_POD))
    assert "--ca-from" not in named(pod, "effect-sidecar")["command"]
    assert all(v["name"] != "effect-sidecar-ca" for v in pod["spec"]["volumes"])


def test_a_pod_volume_named_like_the_ca_volume_is_an_error_with_a_ca_secret():
    manifest = load(AGENT_POD)
    manifest["spec"].setdefault("volumes", []).append({"name": "effect-sidecar-ca", "emptyDir": {}})
    assert inject(copy.deepcopy(manifest), "agents", CONFIG).injected
    with pytest.raises(InvalidInjection, match="effect-sidecar-ca"):
        inject(manifest, "agents", InjectConfig(ca_secret="team-ca"))
