"""Injection of real-world manifests: valid for Kubernetes, complete, idempotent, whole or
not at all."""

from __future__ import annotations

import copy
import json

import pytest

from sidecar.agent.trust import TRUST_VARIABLES
from sidecar.errors import InvalidInjection
from sidecar.kube.config import InjectConfig
from sidecar.kube.containers import BUNDLE, TOKEN_DIR, TOKEN_VOLUME
from sidecar.kube.inject import JOB_END_WARNING, inject, kept_trust_warning
from tests.unit.kube.manifests import (
    AGENT_POD,
    ALL,
    CRONJOB,
    DEPLOYMENT,
    FALLBACK_VERSIONS,
    INDEXED_JOB,
    JOB_PLAIN,
    JOB_WITH_INIT,
    NATIVE_VERSIONS,
    PARALLEL_JOB,
    POD_WITH_OTHER_SIDECAR,
    STATEFULSET,
    assert_valid,
    env_of,
    job_pod,
    load,
    named,
    pod_template,
    resolved_env,
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
    assert JOB_END_WARNING in inject(pod, "agents", fallback).warnings
    # The agent's containers get the token the shutdown needs, read-only.
    agent = inject(load(JOB_PLAIN), "agents", fallback).manifest
    mounts = [m for c in pod_template(agent)["spec"]["containers"][1:] for m in c["volumeMounts"]]
    assert {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True} in mounts
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
        (lambda m: m["metadata"]["annotations"].pop("effect-sidecar.io/inject")
         and m["spec"].update({"hostNetwork": True}), "agents", "not opted in"),
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
        ("allow-host-network", "yes", 'effect-sidecar.io/allow-host-network: expected "true"'),
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


# --- malformed manifests: refused naming the field, never a crash -------------------------


def _pod_with(change) -> dict:
    pod = load(AGENT_POD)
    change(pod)
    return pod


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p["spec"].update(containers={"agent": {"image": "x"}}),
         "spec.containers: expected a list, got an object"),
        (lambda p: p["spec"]["containers"].append(None),
         "spec.containers[1]: expected an object (a container), got null"),
        (lambda p: p["spec"]["containers"][0].update(env="SSL_CERT_FILE=/x"),
         "spec.containers[0].env: expected a list, got a string"),
        (lambda p: p["spec"]["containers"][0].update(env=[{"value": "x"}]),
         "spec.containers[0].env[0].name: expected a string, got nothing"),
        (lambda p: p["spec"]["containers"][0].update(volumeMounts=[{"mountPath": 5}]),
         "spec.containers[0].volumeMounts[0].mountPath: expected a string, got a number"),
        (lambda p: p["spec"]["containers"][0].pop("name"),
         "spec.containers[0].name: expected a string, got nothing"),
        (lambda p: p["spec"].update(initContainers="clone"),
         "spec.initContainers: expected a list, got a string"),
        (lambda p: p["spec"].update(volumes=[["workspace"]]),
         "spec.volumes[0]: expected an object (a volume), got a list"),
        (lambda p: p["spec"].update(securityContext=[]),
         "spec.securityContext: expected an object, got a list"),
        (lambda p: p["spec"].update(hostNetwork="false"),
         "spec.hostNetwork: expected true or false, got a string"),
        (lambda p: p["metadata"].update(annotations=["effect-sidecar.io/inject=true"]),
         "metadata.annotations: expected an object, got a list"),
        (lambda p: p["metadata"]["annotations"].update({"effect-sidecar.io/task": None}),
         "metadata.annotations['effect-sidecar.io/task']: expected a string, got null"),
        (lambda p: p["metadata"].update(ownerReferences={"kind": "Job"}),
         "metadata.ownerReferences: expected a list, got an object"),
        (lambda p: p.update(spec=["agent"]), "spec: expected an object (a pod spec), got a list"),
    ],
)  # fmt: skip
def test_a_malformed_pod_is_refused_naming_the_field_and_what_it_holds(change, message):
    with pytest.raises(InvalidInjection) as caught:
        inject(_pod_with(change), "agents", CONFIG)
    assert message in caught.value.detail


def test_a_malformed_template_is_named_by_its_path_in_the_workload():
    deployment = load(DEPLOYMENT)
    deployment["spec"]["template"]["spec"]["containers"][1] = None
    with pytest.raises(InvalidInjection, match=r"spec\.template\.spec\.containers\[1\]: expected"):
        inject(deployment, "bots", CONFIG)
    cronjob = load(CRONJOB)
    cronjob["spec"]["jobTemplate"]["spec"]["template"] = "bumper"
    with pytest.raises(InvalidInjection, match=r"spec\.jobTemplate\.spec\.template: expected an"):
        inject(cronjob, "agents", CONFIG)
    indexed = load(INDEXED_JOB)
    indexed["spec"]["parallelism"] = "3"
    with pytest.raises(InvalidInjection, match=r"spec\.parallelism: expected an integer"):
        inject(indexed, "agents", CONFIG)


def test_a_pod_that_does_not_opt_in_is_not_read_beyond_its_labels_and_annotations():
    pod = load(AGENT_POD)
    del pod["metadata"]["annotations"]["effect-sidecar.io/inject"]
    pod["spec"]["containers"] = {"agent": None}  # the API server's to refuse, not ours
    outcome = inject(pod, "agents", CONFIG)
    assert (outcome.injected, outcome.reason) == (False, "not opted in")


def nested(depth: int) -> object:
    value: object = "bottom"
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize("depth", [150, 5_000])
def test_a_manifest_nested_deeper_than_any_kubernetes_object_is_refused(depth):
    pod = load(AGENT_POD)
    pod["spec"]["containers"][0]["args"] = [nested(depth)]
    with pytest.raises(InvalidInjection, match="nested more than 100 levels deep"):
        inject(pod, "agents", CONFIG)


# --- hostNetwork: refused unless the pod says to admit it unprotected -----------------------


def test_a_host_network_pod_that_opted_in_is_refused_naming_the_opt_out():
    pod = load(AGENT_POD)
    pod["spec"]["hostNetwork"] = True
    with pytest.raises(InvalidInjection) as caught:
        inject(pod, "agents", CONFIG)
    detail = caught.value.detail
    assert "hostNetwork" in detail
    assert "whole node's traffic" in detail
    assert 'effect-sidecar.io/allow-host-network: "true"' in detail
    assert caught.value.annotation == "effect-sidecar.io/allow-host-network"


def test_allow_host_network_admits_the_pod_unprotected_with_a_warning():
    pod = load(AGENT_POD)
    pod["spec"]["hostNetwork"] = True
    pod["metadata"]["annotations"]["effect-sidecar.io/allow-host-network"] = "true"
    outcome = inject(pod, "agents", CONFIG)
    assert (outcome.injected, outcome.manifest) == (False, pod)
    assert outcome.reason == "hostNetwork pod admitted unprotected"
    (warning,) = outcome.warnings
    assert "WITHOUT the sidecar" in warning
    assert len(warning) <= 256


def test_a_host_network_pod_in_a_skipped_namespace_is_still_never_refused():
    pod = load(AGENT_POD)
    pod["spec"]["hostNetwork"] = True
    assert inject(pod, "kube-system", CONFIG).reason == "namespace kube-system is skipped"


# --- Jobs with several pods: one task per completion index ----------------------------------


def test_each_completion_index_of_an_indexed_job_gets_its_own_task():
    job = injected(INDEXED_JOB)
    assert_valid(job, NATIVE_VERSIONS)
    tasks = [
        resolved_env(job_pod(job, index), "effect-sidecar")["SIDECAR_TASK"] for index in range(5)
    ]
    assert tasks == [f"indexed-job-{index}" for index in range(5)]
    assert status(job)["taskIndex"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    # the app keeps the index the Job controller gives every container
    worker = resolved_env(job_pod(job, 3), "worker")
    assert worker["JOB_COMPLETION_INDEX"] == "3"


def test_an_indexed_cronjob_and_an_annotated_task_get_one_task_per_index_too():
    cronjob = load(CRONJOB)
    job_spec = cronjob["spec"]["jobTemplate"]["spec"]
    job_spec.update(completions=2, parallelism=2, completionMode="Indexed")
    job_spec["template"]["metadata"]["annotations"]["effect-sidecar.io/task"] = "bump"
    manifest = inject(cronjob, "agents", CONFIG).manifest
    assert_valid(manifest, FALLBACK_VERSIONS)
    job = {"kind": "Job", "metadata": {"name": "dependency-bumper-29111"},
           **manifest["spec"]["jobTemplate"]}  # fmt: skip
    tasks = [resolved_env(job_pod(job, i), "effect-sidecar")["SIDECAR_TASK"] for i in (0, 1)]
    assert tasks == ["bump-0", "bump-1"]


def test_a_pod_of_an_indexed_job_seen_by_the_webhook_gets_its_indexs_task():
    for index in (0, 4):
        pod = job_pod(load(INDEXED_JOB), index)  # made from the template as it was written
        manifest = inject(pod, "agents", CONFIG).manifest
        assert_valid(manifest, NATIVE_VERSIONS)
        assert resolved_env(manifest, "effect-sidecar")["SIDECAR_TASK"] == f"indexed-job-{index}"


def test_a_job_without_indexes_keeps_one_task_for_its_pods():
    job = injected(JOB_PLAIN)
    assert resolved_env(job_pod(job), "effect-sidecar")["SIDECAR_TASK"] == "nightly-report"
    assert "taskIndex" not in status(job)


@pytest.mark.parametrize(
    ("change", "warned"),
    [
        (lambda spec: None, True),  # parallelism: 3, no completions: a work queue
        (lambda spec: spec.update(parallelism=1, completions=5), True),
        (lambda spec: spec.update(completionMode="NonIndexed", completions=6), True),
        (lambda spec: spec.update(parallelism=1), False),
        (lambda spec: spec.update(completions=3, completionMode="Indexed"), False),
    ],
)  # fmt: skip
def test_a_job_running_several_pods_without_indexes_is_warned_they_share_one_task(change, warned):
    job = load(PARALLEL_JOB)
    change(job["spec"])
    outcome = inject(job, "agents", CONFIG)
    assert outcome.injected
    shared = [w for w in outcome.warnings if "share one task and one lease" in w]
    assert len(shared) == (1 if warned else 0)
    for warning in shared:
        assert "completionMode: Indexed" in warning
        assert len(warning) <= 256, "the API server may cut longer warnings"


# --- CA variables the app sets itself: kept, and warned about -------------------------------


def test_an_app_that_sets_its_own_ca_variable_is_warned_naming_container_and_variable():
    outcome = inject(load(AGENT_POD), "agents", CONFIG)
    (warning,) = outcome.warnings
    assert "container 'agent'" in warning
    assert "REQUESTS_CA_BUNDLE" in warning
    assert len(warning) <= 256
    other = inject(load(POD_WITH_OTHER_SIDECAR), "agents", CONFIG).warnings
    assert [w for w in other if "SSL_CERT_FILE" in w and "'agent'" in w] == list(other)


def test_one_warning_per_kept_ca_variable_and_none_for_the_sidecars_own_bundle():
    pod = load(AGENT_POD)
    pod["spec"]["containers"][0]["env"] += [
        {"name": "NODE_EXTRA_CA_CERTS", "value": "/etc/ssl/corp.pem"},
        {"name": "CURL_CA_BUNDLE", "value": BUNDLE},  # already the sidecar's bundle
        {"name": "HTTPS_PROXY", "value": "http://corp-proxy:3128"},  # not a CA variable
    ]
    warnings = inject(pod, "agents", CONFIG).warnings
    assert [w.split(" sets ")[1].split()[0] for w in warnings] == [
        "REQUESTS_CA_BUNDLE",
        "NODE_EXTRA_CA_CERTS",
    ]
    longest = kept_trust_warning("a" * 63, "NODE_EXTRA_CA_CERTS")  # 63: a container name's max
    assert len(longest) <= 256, "the API server may cut longer warnings"


def test_null_lists_and_objects_are_read_as_empty_ones():
    pod = load(AGENT_POD)
    pod["metadata"]["labels"] = None
    agent = pod["spec"]["containers"][0]
    agent.update(env=None, volumeMounts=None, securityContext=None)
    pod["spec"].update(volumes=None, initContainers=None)
    manifest = inject(pod, "agents", CONFIG).manifest
    assert env_of(named(manifest, "agent"))["SSL_CERT_FILE"] == BUNDLE
    assert [m["name"] for m in named(manifest, "agent")["volumeMounts"]] == ["effect-sidecar-trust"]
