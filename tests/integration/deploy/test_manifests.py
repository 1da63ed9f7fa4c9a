"""deploy/: every kustomization renders with ``kubectl kustomize``, every rendered object
and every example is valid Kubernetes (strict JSON schemas, 1.29 and the newest version
kubernetes-validate ships), and the properties deploy/README.md promises hold: the
webhook's scope, its hardening, its TLS wiring (and, self-signed, RBAC limited to its own
Secret and configuration), the image's user and contents.

kubectl (and openssl, for the static-tls overlay) are real programs run as subprocesses;
without them the tests skip, except under CI=true, where they fail.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from sidecar.cli import build_parser
from sidecar.cli import webhook as webhook_cli
from sidecar.kube.config import load_config
from tests.support import kubeapi

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
WEBHOOK = DEPLOY / "webhook"
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))

KUBERNETES_VERSIONS = ("1.29.0", latest_version())
SELF_SIGNED = "webhook/overlays/self-signed"
# deploy/webhook itself and the overlays that serve a certificate from files (cert-manager's
# or the operator's), and the one where the webhook makes its own.
FILE_TLS = ("webhook", "webhook/overlays/cert-manager", "webhook/overlays/static-tls")
KUSTOMIZATIONS = (*FILE_TLS, SELF_SIGNED)
RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}
NAMESPACE = "effect-sidecar-system"
NEVER_INJECTED = {"kube-system", "kube-public", "kube-node-lease", NAMESPACE}
SERVICE_DNS = f"effect-sidecar-webhook.{NAMESPACE}.svc"
# cert-manager's CRDs are not in kubernetes-validate's schemas; their shape is checked by
# cert_manager_problems() below instead.
CERT_MANAGER_KINDS = {"Issuer", "Certificate"}

type Obj = dict[str, Any]


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        reason = f"{name} is not installed"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (CI=true: the deploy/ tests need it)")
        pytest.skip(reason)
    return path


def readme_block(marker: str) -> str:
    """The bash block of deploy/README.md between <!-- marker:start/end -->."""
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    found = re.search(
        rf"<!-- {marker}:start -->\s*```bash\n(.*?)```\s*<!-- {marker}:end -->", text, re.S
    )
    assert found, f"deploy/README.md has no {marker} block"
    return found.group(1)


@pytest.fixture(scope="module")
def deploy_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's deploy/ with the static-tls files made by the README's
    own openssl commands (the overlay needs them; they are never committed)."""
    tool("openssl")
    root = tmp_path_factory.mktemp("repo")
    shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("tls"))
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block("static-tls")],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return root / "deploy"


@pytest.fixture(scope="module")
def rendered(deploy_copy: Path) -> dict[str, list[Obj]]:
    kubectl = tool("kubectl")
    out: dict[str, list[Obj]] = {}
    for name in KUSTOMIZATIONS:
        done = subprocess.run(
            [kubectl, "kustomize", str(deploy_copy / name)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl kustomize deploy/{name}:\n{done.stderr}"
        out[name] = [obj for obj in yaml.safe_load_all(done.stdout) if obj]
    return out


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} rendered"
    return found[0]


def cert_manager_problems(obj: Obj) -> list[str]:
    """A minimal shape check of cert-manager.io/v1 Issuer and Certificate."""
    spec = obj.get("spec") or {}
    problems = []
    if obj.get("apiVersion") != "cert-manager.io/v1":
        problems.append(f"apiVersion {obj.get('apiVersion')!r}")
    if not obj.get("metadata", {}).get("namespace"):
        problems.append("no namespace")
    if obj["kind"] == "Issuer":
        kinds = {"selfSigned", "ca", "acme", "vault", "venafi"} & set(spec)
        if len(kinds) != 1:
            problems.append(f"an Issuer needs exactly one issuer type, has {sorted(kinds)}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            problems.append("ca issuer without secretName")
    else:
        for field in ("secretName", "issuerRef"):
            if field not in spec:
                problems.append(f"Certificate without {field}")
        if not spec.get("isCA") and not spec.get("dnsNames"):
            problems.append("serving Certificate without dnsNames")
        if spec.get("issuerRef", {}).get("kind") not in {"Issuer", "ClusterIssuer"}:
            problems.append(f"issuerRef.kind {spec.get('issuerRef', {}).get('kind')!r}")
    return problems


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_every_rendered_object_validates(
    rendered: dict[str, list[Obj]], name: str, version: str
) -> None:
    objects = rendered[name]
    kinds = sorted(o["kind"] for o in objects)
    for required in (
        "Namespace",
        "ServiceAccount",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
    ):
        assert required in kinds, f"deploy/{name} renders no {required}"
    for obj in objects:
        if obj["kind"] in CERT_MANAGER_KINDS:
            assert cert_manager_problems(obj) == [], obj["metadata"]["name"]
            continue
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(path: Path, version: str) -> None:
    for obj in yaml.safe_load_all(path.read_text(encoding="utf-8")):
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_misspelt_field(rendered: dict[str, list[Obj]]) -> None:
    """So that "validates" above means something: an unknown field is an error."""
    deployment = copy.deepcopy(one(rendered["webhook"], "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSIONS[0], strict=True)


def test_deploy_webhook_is_the_cert_manager_overlay(rendered: dict[str, list[Obj]]) -> None:
    assert rendered["webhook"] == rendered["webhook/overlays/cert-manager"]


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_webhook_sees_only_opted_in_pod_creation(rendered: dict[str, list[Obj]], name: str) -> None:
    objects = rendered[name]
    (webhook,) = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "None"
    assert webhook["failurePolicy"] == "Fail"
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert 1 <= webhook["timeoutSeconds"] <= 10
    assert webhook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    assert webhook["objectSelector"] == {"matchLabels": {"effect-sidecar.io/inject": "true"}}
    # One expression, on the name label the API server sets itself, excluding the four.
    (expression,) = webhook["namespaceSelector"]["matchExpressions"]
    assert webhook["namespaceSelector"].keys() == {"matchExpressions"}
    assert expression["key"] == "kubernetes.io/metadata.name"
    assert expression["operator"] == "NotIn"
    assert set(expression["values"]) == NEVER_INJECTED

    # It calls the rendered Service, which reaches the webhook container's port.
    target = webhook["clientConfig"]["service"]
    service = one(objects, "Service", target["name"])
    assert service["metadata"]["namespace"] == target["namespace"] == NAMESPACE
    assert target["path"] == "/mutate"
    (port,) = service["spec"]["ports"]
    assert port["port"] == target["port"] == 443
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "https", "containerPort": 8443, "protocol": "TCP"} in container["ports"]
    assert port["targetPort"] == "https"
    assert (
        service["spec"]["selector"].items()
        <= deployment["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize("name", KUSTOMIZATIONS)
def test_webhook_deployment_is_hardened(rendered: dict[str, list[Obj]], name: str) -> None:
    objects = rendered[name]
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1337
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "limits" in container["resources"]
    assert "requests" in container["resources"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {
            "path": "/healthz",
            "port": "https",
            "scheme": "HTTPS",
        }
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["config"] == "/etc/effect-sidecar"
    config_map = one(objects, "ConfigMap", volumes["config"]["configMap"]["name"])
    assert "inject.yaml" in config_map["data"]
    # The PodDisruptionBudget guards these pods.
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 1
    assert (
        budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    )
    cluster_scoped = {"Namespace", "MutatingWebhookConfiguration", "ClusterRole"}
    namespaced = [o for o in objects if o["kind"] not in cluster_scoped | {"ClusterRoleBinding"}]
    assert {o["metadata"]["namespace"] for o in namespaced} == {NAMESPACE}


@pytest.mark.parametrize("name", FILE_TLS)
def test_file_tls_serves_the_mounted_secret_and_calls_no_api(
    rendered: dict[str, list[Obj]], name: str
) -> None:
    objects = rendered[name]
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [
        "webhook",
        "--listen",
        "0.0.0.0:8443",
        "--tls-cert",
        "/tls/tls.crt",
        "--tls-key",
        "/tls/tls.key",
        "--config",
        "/etc/effect-sidecar/inject.yaml",
    ]
    # The files the args name are mounted: the TLS Secret.
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["tls"] == "/tls"
    tls_secret = volumes["tls"]["secret"]["secretName"]
    assert tls_secret.startswith("effect-sidecar-webhook-tls")
    # No token and no RBAC, since no API is called.
    assert pod["automountServiceAccountToken"] is False
    assert not RBAC_KINDS & {o["kind"] for o in objects}


def test_injection_config_loads_and_matches_the_webhook(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """The ConfigMap's inject.yaml is what `sidecar webhook --config` accepts, and it
    names the Secrets of the examples and the namespace the MWC excludes."""
    objects = rendered["webhook"]
    path = tmp_path / "inject.yaml"
    path.write_text(one(objects, "ConfigMap")["data"]["inject.yaml"], encoding="utf-8")
    config = load_config(path)
    assert config.namespace == NAMESPACE
    assert set(config.skip_namespaces) | {config.namespace} == NEVER_INJECTED
    assert config.run_as_user == 1337
    (container,) = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert config.image == container["image"]
    secrets = {
        obj["metadata"]["name"]: obj["stringData"]
        for path in EXAMPLES
        for obj in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if obj["kind"] == "Secret"
    }
    assert config.store_secret is not None
    assert config.store_secret.key in secrets[config.store_secret.name]
    assert config.control_token_secret.key in secrets[config.control_token_secret.name]


def test_cert_manager_overlay_wires_the_ca(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered["webhook/overlays/cert-manager"]
    annotations = one(objects, "MutatingWebhookConfiguration")["metadata"]["annotations"]
    namespace, name = annotations["cert-manager.io/inject-ca-from"].split("/")
    certificate = one(objects, "Certificate", name)
    assert certificate["metadata"]["namespace"] == namespace == NAMESPACE
    assert SERVICE_DNS in certificate["spec"]["dnsNames"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == certificate["spec"]["secretName"]
    # Signed by a CA of its own, so a renewal leaves the caBundle as it was.
    issuer = one(objects, "Issuer", certificate["spec"]["issuerRef"]["name"])
    ca = one(objects, "Certificate", issuer["spec"]["ca"]["secretName"])
    assert ca["spec"]["isCA"] is True


def test_static_tls_overlay_carries_the_operators_ca(
    rendered: dict[str, list[Obj]], deploy_copy: Path
) -> None:
    objects = rendered["webhook/overlays/static-tls"]
    files = deploy_copy / "webhook/overlays/static-tls/tls"
    (webhook,) = one(objects, "MutatingWebhookConfiguration")["webhooks"]
    ca = base64.b64decode(webhook["clientConfig"]["caBundle"])
    assert ca == (files / "ca.crt").read_bytes()
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    secret = one(objects, "Secret", volumes["tls"]["secret"]["secretName"])
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}
    # The README's certificate is one the API server accepts for the Service's name.
    done = subprocess.run(
        [tool("openssl"), "verify", "-CAfile", "ca.crt", "tls.crt"],
        cwd=files,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    done = subprocess.run(
        [tool("openssl"), "x509", "-in", "tls.crt", "-noout", "-checkhost", SERVICE_DNS],
        cwd=files,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "does match certificate" in done.stdout, done.stdout + done.stderr


def options(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a container's args after the verb."""
    assert args[0] == "webhook"
    pairs = args[1:]
    assert all(flag.startswith("--") for flag in pairs[::2]), pairs
    return dict(zip(pairs[::2], pairs[1::2], strict=True))


def self_signed_parts(objects: list[Obj]) -> tuple[Obj, Obj, dict[str, str]]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container, options(container["args"])


def test_self_signed_overlay_makes_its_own_tls(rendered: dict[str, list[Obj]]) -> None:
    objects = rendered[SELF_SIGNED]
    pod, container, args = self_signed_parts(objects)
    assert "--tls-cert" not in args
    assert "--tls-key" not in args
    # The configuration it patches is the one rendered, still without a caBundle or a
    # cainjector annotation: the webhook sets the caBundle.
    configuration = one(objects, "MutatingWebhookConfiguration")
    assert args["--webhook-configuration"] == configuration["metadata"]["name"]
    (webhook,) = configuration["webhooks"]
    assert "caBundle" not in webhook["clientConfig"]
    assert "annotations" not in configuration["metadata"]
    # The certificate is for the Service the API server calls, in the webhook's namespace.
    service = webhook["clientConfig"]["service"]
    assert args["--service"] in {service["name"], f"{service['name']}.{service['namespace']}"}
    assert service["namespace"] == NAMESPACE
    # The pair goes to a writable emptyDir (the root filesystem stays read-only); the
    # Secret is read through the API, never mounted, and not rendered (the webhook makes it).
    mount = one_mount(container, args["--cert-dir"])
    assert mount.get("readOnly") is not True
    volume = {v["name"]: v for v in pod["volumes"]}[mount["name"]]
    assert set(volume) == {"name", "emptyDir"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert not {"Secret", *CERT_MANAGER_KINDS} & {o["kind"] for o in objects}
    # Its token, for the rights below; and a startup probe, since nothing listens until
    # the certificate is there.
    assert pod["automountServiceAccountToken"] is True
    assert container["startupProbe"]["httpGet"] == container["readinessProbe"]["httpGet"]
    assert (
        container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
        >= 60
    )
    # `sidecar webhook` itself accepts the args as a complete self-signed setup.
    parsed = build_parser().parse_args(container["args"])
    webhook_cli.tls_mode(parsed)
    assert parsed.self_signed_secret == args["--self-signed-secret"]


def one_mount(container: Obj, path: str) -> Obj:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == path]
    return mount


def rule_set(rules: list[Obj]) -> set[tuple[tuple[str, ...], ...]]:
    return {
        tuple(
            (key, *sorted(rule.get(key, ())))
            for key in ("apiGroups", "resources", "resourceNames", "verbs")
        )
        for rule in rules
    }


def test_self_signed_rbac_is_its_secret_and_its_configuration_only(
    rendered: dict[str, list[Obj]],
) -> None:
    objects = rendered[SELF_SIGNED]
    pod, _, args = self_signed_parts(objects)
    secret, configuration = args["--self-signed-secret"], args["--webhook-configuration"]
    role = one(objects, "Role")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert len(role["rules"]) == 2
    # get/update name the Secret; create cannot (its request has no name yet)
    assert rule_set(role["rules"]) == rule_set(
        [
            {
                "apiGroups": [""],
                "resources": ["secrets"],
                "resourceNames": [secret],
                "verbs": ["get", "update"],
            },
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        ]
    )
    cluster_role = one(objects, "ClusterRole")
    assert len(cluster_role["rules"]) == 1
    assert rule_set(cluster_role["rules"]) == rule_set(
        [
            {
                "apiGroups": ["admissionregistration.k8s.io"],
                "resources": ["mutatingwebhookconfigurations"],
                "resourceNames": [configuration],
                "verbs": ["get", "patch"],
            }
        ]
    )
    for rule in role["rules"] + cluster_role["rules"]:
        assert "*" not in {*rule["verbs"], *rule["resources"], *rule["apiGroups"]}
    account = {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    for binding, kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        bound = one(objects, binding)
        assert bound["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": kind,
            "name": one(objects, kind)["metadata"]["name"],
        }
        assert bound["subjects"] == [account]

    # What those rules let the webhook's service account do, by RBAC's own matching.
    grants = kubeapi.grants_from_manifests(objects)
    user = kubeapi.service_account(NAMESPACE, pod["serviceAccountName"])
    secrets, webhooks = kubeapi.KINDS[kubeapi.SECRETS], kubeapi.KINDS[kubeapi.WEBHOOKS]

    def may(verb: str, kind: kubeapi.Kind, name: str, namespace: str = NAMESPACE) -> bool:
        return kubeapi.permits(grants, user, verb, kind, namespace, name)

    assert may("get", secrets, secret)
    assert may("update", secrets, secret)
    assert may("create", secrets, "")
    assert may("get", webhooks, configuration)
    assert may("patch", webhooks, configuration)
    assert not may("get", secrets, "effect-sidecar-store")
    assert not may("list", secrets, "")
    assert not may("delete", secrets, secret)
    assert not may("get", secrets, secret, namespace="agents")
    assert not may("create", secrets, "", namespace="agents")
    assert not may("patch", webhooks, "someone-elses-webhook")
    assert not may("update", webhooks, configuration)
    assert not may("delete", webhooks, configuration)


def test_example_job_opts_in_and_names_its_task(rendered: dict[str, list[Obj]]) -> None:
    (job,) = yaml.safe_load_all((DEPLOY / "examples/agent-job.yaml").read_text(encoding="utf-8"))
    template = job["spec"]["template"]
    (webhook,) = one(rendered["webhook"], "MutatingWebhookConfiguration")["webhooks"]
    # The webhook's objectSelector matches the pod's labels; the task is an annotation.
    assert (
        webhook["objectSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    )
    assert template["metadata"]["annotations"]["effect-sidecar.io/task"] == "312"
    assert job["metadata"]["namespace"] not in NEVER_INJECTED
    spec = template["spec"]
    assert spec["restartPolicy"] == "Never"
    # The redirect rules exempt uid 1337; an agent running as it would bypass the sidecar.
    assert spec["securityContext"]["runAsUser"] != 1337


def dockerfile_stages() -> list[list[str]]:
    """deploy/Dockerfile's instructions (continuations joined, comments dropped), by stage."""
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    instructions = [" ".join(i.split()) for i in "\n".join(lines).replace("\\\n", " ").splitlines()]
    stages: list[list[str]] = []
    for instruction in filter(None, instructions):
        if instruction.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


COMPILERS = {"gcc", "g++", "cc", "c++", "clang", "make", "build-essential", "cpp", "binutils"}
COMPILERS |= {"rustc", "cargo", "libc6-dev", "python3-dev", "pip", "wheel"}


def build_tools(command: str) -> set[str]:
    """Compilers, headers (*-dev packages) and installers named in a shell command."""
    words = {word.strip(";&|") for word in shlex.split(command)}
    return {w for w in words if w in COMPILERS or (w.endswith("-dev") and not w.startswith("/"))}


def test_image_final_stage_runs_as_1337_without_compilers() -> None:
    builder, final = dockerfile_stages()
    assert builder[0] == "FROM ${PYTHON_IMAGE} AS builder"
    assert final[0] == "FROM ${PYTHON_IMAGE}"
    assert "ARG PYTHON_IMAGE=python:3.12-slim" in (DEPLOY / "Dockerfile").read_text(
        encoding="utf-8"
    )
    users = [i.split(maxsplit=1)[1] for i in final if i.startswith("USER ")]
    assert users == ["1337:1337"]
    assert final[-2:] == ['ENTRYPOINT ["sidecar"]', 'CMD ["--help"]']
    (copy_from,) = [i for i in final if i.startswith("COPY ")]
    assert copy_from == "COPY --from=builder /opt/effect-sidecar /opt/effect-sidecar"
    runs = " ".join(i for i in final if i.startswith("RUN "))
    installed: list[str] = []
    for command in re.findall(r"apt-get install ([^&]*)", runs):
        installed += [word for word in shlex.split(command) if not word.startswith("-")]
    assert sorted(installed) == ["ca-certificates", "git", "iptables"]
    assert "--no-install-recommends" in runs
    assert "useradd --system --uid 1337 --gid 1337" in runs
    assert build_tools(runs) == set()
    # The shipped rule packs land where an installed sidecar looks (sidecar/rules/packs.py).
    assert "COPY rules /opt/effect-sidecar/share/effect-sidecar/rules" in builder


def test_build_context_filter_keeps_only_the_sources() -> None:
    lines = (DEPLOY / "Dockerfile.dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line for line in lines if line and not line.startswith("#")]
    assert patterns[0] == "*"
    assert set(patterns) >= {"!pyproject.toml", "!README.md", "!sidecar/", "!rules/"}
