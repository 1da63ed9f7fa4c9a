"""``sidecar webhook --self-signed-secret`` as real processes against the Kubernetes API
emulator: the Secret made once and shared, the ``caBundle`` set, and the webhook then
called the way the API server calls it - over TLS, to the Service's DNS name, trusting
only that ``caBundle``. Replicas racing, restarts, renewals, a running webhook following
the Secret, an API that is unreachable or refuses the token, and the RBAC of
deploy/webhook/overlays/self-signed as the only rights."""

from __future__ import annotations

import base64
import copy
import datetime
import json
import os
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from cryptography import x509

from sidecar.kube import certgen
from sidecar.testing.processes import Child
from tests.integration.kube.conftest import (
    ACCOUNT,
    NAMESPACE,
    REPO,
    TOKEN,
    Cluster,
    base_configuration,
)
from tests.support import certs
from tests.support.kubeapi import SECRETS, WEBHOOKS, grants_from_manifests
from tests.support.ports import free_port
from tests.unit.kube.manifests import AGENT_POD, load
from tests.unit.kube.test_webhook import admission

SECRET = "effect-sidecar-webhook-selfsigned"
CONFIGURATION = "effect-sidecar"
NAMES = certgen.dns_names("effect-sidecar-webhook", NAMESPACE)
SERVICE_DNS = NAMES[0]  # what the API server dials
READY = r"effect-sidecar webhook ready (\S+)"
PATIENCE_S = 15.0


@dataclass
class Replica:
    child: Child
    cert_dir: Path
    log: Path
    url: str = ""

    def wait_ready(self) -> str:
        self.url = self.child.wait_for(READY, timeout=PATIENCE_S).group(1)
        return self.url

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8") if self.log.exists() else ""

    def wait_log(self, text: str) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while text not in self.log_text():
            if time.monotonic() > deadline:
                pytest.fail(f"the webhook did not log {text!r}:\n{self.log_text()}")
            time.sleep(0.05)


@pytest.fixture
def replicas(cluster: Cluster, tmp_path: Path) -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.child.kill()


def launch(
    replicas: list[Replica],
    cluster: Cluster,
    tmp_path: Path,
    *extra: str,
    args: list[str] | None = None,
) -> Replica:
    """A ``sidecar webhook`` process in the self-signed mode, not waited for."""
    name = f"replica-{len(replicas)}"
    cert_dir = tmp_path / name / "tls"
    log = tmp_path / name / "webhook.log"
    log.parent.mkdir(parents=True)
    argv = args or [
        "webhook",
        "--listen",
        "127.0.0.1:0",
        "--self-signed-secret",
        SECRET,
        "--cert-dir",
        str(cert_dir),
    ]
    argv += ["--reload-s", "0.1", *cluster.kube_args(), *extra]
    replica = Replica(Child.python("sidecar", *argv, stderr_path=log), cert_dir, log)
    replicas.append(replica)
    return replica


def ca_bundle(cluster: Cluster) -> bytes:
    """The CA PEM the API server trusts for the webhook: every webhook's caBundle."""
    configuration = cluster.api.get(WEBHOOKS, CONFIGURATION)
    assert configuration is not None
    bundles = {w["clientConfig"].get("caBundle") for w in configuration["webhooks"]}
    assert len(bundles) == 1, f"the webhooks disagree: {bundles}"
    (bundle,) = bundles
    assert bundle, "no caBundle set"
    return base64.b64decode(bundle)


def stored_bundle(cluster: Cluster) -> certgen.Bundle:
    secret = cluster.api.get(SECRETS, SECRET, NAMESPACE)
    assert secret is not None, "no Secret"
    assert secret["type"] == "kubernetes.io/tls"
    return certgen.Bundle.from_secret_data(secret["data"])


def trusting(ca_pem: bytes) -> ssl.SSLContext:
    """A client context that trusts ``ca_pem`` and nothing else (no system roots)."""
    return ssl.create_default_context(cadata=ca_pem.decode())


def served_serial(url: str, ca_pem: bytes, name: str = SERVICE_DNS) -> int:
    """The serial of the certificate a new connection is shown, verified for ``name``."""
    host, port = url.removeprefix("https://").rsplit(":", 1)
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        trusting(ca_pem).wrap_socket(raw, server_hostname=name) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def review(url: str, ca_pem: bytes) -> dict:
    """POST an AdmissionReview as the API server does: to the Service's name (SNI and
    hostname check), trusting only the caBundle."""
    with httpx.Client(verify=trusting(ca_pem), timeout=10) as client:
        answer = client.post(
            f"{url}/mutate",
            json=admission(load(AGENT_POD)),
            extensions={"sni_hostname": SERVICE_DNS},
        )
    assert answer.status_code == 200
    body = answer.json()
    assert body["kind"] == "AdmissionReview"
    return body["response"]


def writes(cluster: Cluster) -> list[tuple[str, str, int]]:
    """The requests that could change something: (method, resource, status)."""
    return [
        (r.method, r.path.rsplit("/", 2)[-2 if r.method != "POST" else -1], r.status)
        for r in cluster.api.requests()
        if r.method != "GET"
    ]


def seed(cluster: Cluster, bundle: certgen.Bundle) -> None:
    cluster.api.put(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": NAMESPACE},
            "type": "kubernetes.io/tls",
            "data": bundle.secret_data(),
        }
    )


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def test_first_start_makes_the_secret_and_the_ca_bundle_the_api_server_trusts(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica]
):
    # a configuration of two webhooks: each gets the caBundle
    configuration = base_configuration()
    second = copy.deepcopy(configuration["webhooks"][0]) | {"name": "again.effect-sidecar.io"}
    configuration["webhooks"].append(second)
    cluster.api.put(configuration)
    replica = launch(replicas, cluster, tmp_path)
    url = replica.wait_ready()
    bundle = stored_bundle(cluster)
    assert certgen.problem(bundle, NAMES, now()) is None
    stored = cluster.api.get(WEBHOOKS, CONFIGURATION)
    assert stored is not None
    assert [w["name"] for w in stored["webhooks"]] == [
        "inject.effect-sidecar.io",
        "again.effect-sidecar.io",
    ]
    assert ca_bundle(cluster) == bundle.ca_crt
    assert writes(cluster) == [("POST", SECRETS, 201), ("PATCH", WEBHOOKS, 200)]

    response = review(url, ca_bundle(cluster))
    assert (response["allowed"], response["patchType"]) == (True, "JSONPatch")
    assert served_serial(url, ca_bundle(cluster)) == bundle.certificate.serial_number
    # the check is real: another name, or another CA, is refused by the client
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        served_serial(url, ca_bundle(cluster), "effect-sidecar-webhook.default.svc")
    with pytest.raises(ssl.SSLCertVerificationError):
        served_serial(url, certs.cert_pem(certs.make_ca()[0]))
    with httpx.Client(verify=trusting(ca_bundle(cluster))) as client:
        health = client.get(f"{url}/healthz", extensions={"sni_hostname": SERVICE_DNS})
    assert health.json() == {"status": "ok"}
    # the pair served is the Secret's, written as files for the reloader
    assert (replica.cert_dir / "tls.crt").read_bytes() == bundle.tls_crt
    assert replica.child.terminate() == 0
    log = replica.log_text()
    assert f"webhook certificate created in Secret {NAMESPACE}/{SECRET}" in log
    assert f"caBundle of MutatingWebhookConfiguration {CONFIGURATION} set" in log
    assert TOKEN not in log
    assert "PRIVATE KEY" not in log


@pytest.mark.parametrize("start", ["no Secret", "an expiring Secret"])
def test_two_replicas_starting_together_converge_on_one_certificate(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica], start: str
):
    if start == "an expiring Secret":
        seed(cluster, certgen.make(NAMES, now() - datetime.timedelta(days=364)))
    # both read before either writes: the race optimistic concurrency has to settle
    cluster.api.hold("GET", SECRETS, 2)
    first, second = launch(replicas, cluster, tmp_path), launch(replicas, cluster, tmp_path)
    urls = first.wait_ready(), second.wait_ready()
    bundle = stored_bundle(cluster)
    ca_pem = ca_bundle(cluster)
    assert ca_pem == bundle.ca_crt
    serial = bundle.certificate.serial_number
    assert [served_serial(url, ca_pem) for url in urls] == [serial, serial]
    for url in urls:
        assert review(url, ca_pem)["allowed"] is True
    # one write won, the other lost with a 409 and took the winner's certificate
    verb = "POST" if start == "no Secret" else "PUT"
    secret_writes = sorted(status for method, what, status in writes(cluster) if what == SECRETS)
    assert secret_writes == [200 if verb == "PUT" else 201, 409], writes(cluster)
    assert {method for method, what, _ in writes(cluster) if what == SECRETS} == {verb}
    assert "changed the webhook certificate's Secret first" in first.log_text() + second.log_text()


def test_a_restart_reuses_the_secret(cluster: Cluster, tmp_path: Path, replicas: list[Replica]):
    first = launch(replicas, cluster, tmp_path)
    first.wait_ready()
    serial = stored_bundle(cluster).certificate.serial_number
    assert first.child.terminate() == 0
    before = len(writes(cluster))

    again = launch(replicas, cluster, tmp_path)  # a new pod: a new, empty cert dir
    url = again.wait_ready()
    assert served_serial(url, ca_bundle(cluster)) == serial
    assert stored_bundle(cluster).certificate.serial_number == serial
    assert len(writes(cluster)) == before, "nothing written: not the Secret, not the caBundle"


def expiring() -> certgen.Bundle:
    return certgen.make(NAMES, now() - datetime.timedelta(days=340))  # 25 days left


def for_other_names() -> certgen.Bundle:
    return certgen.make(certgen.dns_names("effect-sidecar-webhook", "elsewhere"), now())


def without_ca_key() -> certgen.Bundle:
    ca_cert, ca_key = certs.make_ca()
    cert, key = certs.issue(ca_cert, ca_key, dns=NAMES)
    return certgen.Bundle(certs.cert_pem(cert), certs.key_pem(key), certs.cert_pem(ca_cert), b"")


@pytest.mark.parametrize(
    ("make", "why", "same_ca"),
    [
        (expiring, "tls.crt expires at", True),
        (
            for_other_names,
            "tls.crt does not cover effect-sidecar-webhook.effect-sidecar-system",
            True,
        ),
        (without_ca_key, "the CA cannot be read", False),
    ],
    ids=["expiring", "other-names", "no-ca-key"],
)
def test_a_secret_that_will_not_do_is_replaced(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica], make, why: str, same_ca: bool
):
    old = make()
    seed(cluster, old)
    replica = launch(replicas, cluster, tmp_path)
    url = replica.wait_ready()
    new = stored_bundle(cluster)
    assert new.certificate.serial_number != old.certificate.serial_number
    assert certgen.problem(new, NAMES, now()) is None
    # a CA that is still good signs the renewal, so a caBundle holding it stays valid
    assert (new.ca_crt == old.ca_crt) is same_ca
    assert served_serial(url, ca_bundle(cluster)) == new.certificate.serial_number
    assert ("PUT", SECRETS, 200) in writes(cluster)
    assert (
        f"webhook certificate renewed in Secret {NAMESPACE}/{SECRET}: {why}" in replica.log_text()
    )


def test_a_running_webhook_follows_the_secret_and_keeps_the_ca_bundle(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica]
):
    # the files are checked rarely: a new pair is served because the mode reloads it
    replica = launch(
        replicas, cluster, tmp_path, "--self-signed-check-s", "0.2", "--reload-s", "60"
    )
    url = replica.wait_ready()
    first = stored_bundle(cluster)
    ca_pem = ca_bundle(cluster)

    def serves(serial: int) -> bool:
        deadline = time.monotonic() + PATIENCE_S
        while served_serial(url, ca_pem) != serial:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    # another replica renewed it: taken up as it is, nothing written
    renewed = certgen.make(NAMES, now(), first)
    seed(cluster, renewed)
    writes_before = len(writes(cluster))
    assert serves(renewed.certificate.serial_number)
    assert len(writes(cluster)) == writes_before

    # it is due (in the window): renewed in place, by the same CA
    seed(cluster, certgen.make(NAMES, now() - datetime.timedelta(days=340), first))
    due = stored_bundle(cluster).certificate.serial_number
    deadline = time.monotonic() + PATIENCE_S
    while stored_bundle(cluster).certificate.serial_number == due:
        assert time.monotonic() < deadline, "the due certificate was not renewed"
        time.sleep(0.05)
    current = stored_bundle(cluster)
    assert current.ca_crt == first.ca_crt
    assert serves(current.certificate.serial_number)

    # someone reset the caBundle (a re-apply of another overlay): it is set again
    cluster.api.put(base_configuration())
    deadline = time.monotonic() + PATIENCE_S
    while not all(
        w["clientConfig"].get("caBundle")
        for w in (cluster.api.get(WEBHOOKS, CONFIGURATION) or {})["webhooks"]
    ):
        assert time.monotonic() < deadline, "the caBundle was not set again"
        time.sleep(0.05)
    assert ca_bundle(cluster) == ca_pem
    assert replica.child.terminate() == 0


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_an_unreachable_api_is_logged_and_nothing_listens_until_it_answers(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica]
):
    port = free_port()
    nowhere = f"https://127.0.0.1:{free_port()}"
    replica = launch(
        replicas, cluster, tmp_path, "--kube-api", nowhere, "--listen", f"127.0.0.1:{port}"
    )
    replica.wait_log("retrying in 1s")  # the second failure: it backs off
    log = replica.log_text()
    assert f"Unreachable: {nowhere}" in log
    assert "the Kubernetes API could not be reached" in log
    assert refuses_connections(port), "/healthz must not answer before there is TLS"
    assert not any("webhook ready" in line for line in replica.child.lines)
    assert replica.child.terminate() == 0  # SIGTERM while waiting: a clean stop
    assert TOKEN not in replica.log_text()


def test_a_refused_token_is_logged_without_the_token_and_retried(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica]
):
    cluster.api.revoke(TOKEN)
    replica = launch(replicas, cluster, tmp_path)
    replica.wait_log("401 Unauthorized")
    log = replica.log_text()
    assert "the API refused the service account token" in log
    assert f"GET /api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}" in log
    assert not any("webhook ready" in line for line in replica.child.lines)
    cluster.api.accept(TOKEN, ACCOUNT)  # the token becomes valid: it recovers
    url = replica.wait_ready()
    assert review(url, ca_bundle(cluster))["allowed"] is True
    for line in replica.log_text().splitlines():
        entry = json.loads(line)
        for part in TOKEN.split("."):  # not even a part of it
            assert part not in line, entry


def rendered_overlay() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("CI") == "true":
            pytest.fail("kubectl is not installed (CI=true: the overlay's RBAC is checked)")
        pytest.skip("kubectl is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(REPO / "deploy/webhook/overlays/self-signed")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


def deployment_args(objects: list[dict], cert_dir: Path, config: Path) -> list[str]:
    """The rendered container's args, with the paths and the address made local."""
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = list(container["args"])
    local = {"--listen": "127.0.0.1:0", "--cert-dir": str(cert_dir), "--config": str(config)}
    for option, value in local.items():
        args[args.index(option) + 1] = value
    return args


@pytest.mark.parametrize("bound", ["all", "without the ClusterRoleBinding"])
def test_the_overlays_rbac_is_all_the_webhook_needs(
    cluster: Cluster, tmp_path: Path, replicas: list[Replica], bound: str
):
    objects = rendered_overlay()
    if bound != "all":
        objects = [o for o in objects if o["kind"] != "ClusterRoleBinding"]
    cluster.api.grants = grants_from_manifests(objects)
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
    config = tmp_path / "inject.yaml"
    config.write_text(config_map["data"]["inject.yaml"], encoding="utf-8")
    args = deployment_args(objects, tmp_path / "tls", config)
    replica = launch(replicas, cluster, tmp_path, args=args)
    if bound == "all":
        url = replica.wait_ready()
        assert review(url, ca_bundle(cluster))["allowed"] is True
        assert all(r.status < 400 or r.status == 404 for r in cluster.api.requests())
    else:
        replica.wait_log("403 Forbidden")
        assert "see the Role and ClusterRole of deploy/webhook/overlays/self-signed" in (
            replica.log_text()
        )
        # the Secret was made (the Role allows it); the configuration could not be read
        assert stored_bundle(cluster) is not None
        assert not any("webhook ready" in line for line in replica.child.lines)
