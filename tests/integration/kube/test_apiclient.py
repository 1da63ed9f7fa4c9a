"""The webhook's Kubernetes API client against the API emulator, over TLS: the Secret and
webhook-configuration calls, and each way they fail as the real API server fails them -
NotFound, AlreadyExists, Conflict, Invalid, Unauthorized, Forbidden, unreachable,
untrusted - with the ``Status`` bodies checked byte for byte where the client only reads
a field of them."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from sidecar.kube.apiclient import Credentials, KubeApiError, KubeClient
from tests.integration.kube.conftest import ACCOUNT, NAMESPACE, TOKEN, Cluster
from tests.support import certs
from tests.support.kubeapi import SECRETS, Grant, Rule
from tests.support.ports import free_port

SECRET = "effect-sidecar-webhook-selfsigned"
SECRETS_PATH = f"/api/v1/namespaces/{NAMESPACE}/secrets"
CONFIGURATION = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


def tls_secret(name: str = SECRET, **data: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "type": "kubernetes.io/tls",
        "data": data or {"tls.crt": "Y2VydA==", "tls.key": "a2V5"},
    }


def raw(
    cluster: Cluster,
    method: str,
    path: str,
    token: str | None = TOKEN,
    content_type: str | None = None,
    **kw,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if content_type:
        headers["Content-Type"] = content_type
    context = ssl.create_default_context(cafile=str(cluster.server.ca_file))
    with httpx.Client(verify=context) as client:
        return client.request(method, cluster.server.url + path, headers=headers, **kw)


async def test_a_secret_is_created_read_and_updated_with_versions(cluster: Cluster):
    async with KubeClient(cluster.credentials) as api:
        assert await api.get_secret(NAMESPACE, SECRET) is None
        created = await api.create_secret(NAMESPACE, tls_secret())
        meta = created["metadata"]
        assert meta["uid"]
        assert meta["creationTimestamp"]
        assert created["type"] == "kubernetes.io/tls"
        read = await api.get_secret(NAMESPACE, SECRET)
        assert read == created
        read["data"]["tls.crt"] = "bmV3"
        updated = await api.update_secret(NAMESPACE, read)
        assert int(updated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
        assert updated["metadata"]["uid"] == meta["uid"]
        # an update that changes nothing is not a write: the version stays
        again = await api.update_secret(NAMESPACE, updated)
        assert again["metadata"]["resourceVersion"] == updated["metadata"]["resourceVersion"]


async def test_a_second_create_is_already_exists_and_a_stale_update_a_conflict(cluster: Cluster):
    async with KubeClient(cluster.credentials) as api:
        first = await api.create_secret(NAMESPACE, tls_secret())
        with pytest.raises(KubeApiError) as exists:
            await api.create_secret(NAMESPACE, tls_secret())
        assert (exists.value.status, exists.value.reason) == (409, "AlreadyExists")
        assert exists.value.message == f'secrets "{SECRET}" already exists'
        await api.update_secret(
            NAMESPACE, {**first, "data": {"tls.crt": "YQ==", "tls.key": "Yg=="}}
        )
        with pytest.raises(KubeApiError) as stale:
            await api.update_secret(NAMESPACE, first)  # carries the first resourceVersion
        assert (stale.value.status, stale.value.reason) == (409, "Conflict")
        assert stale.value.message == (
            f'Operation cannot be fulfilled on secrets "{SECRET}": the object has been '
            "modified; please apply your changes to the latest version and try again"
        )


def test_error_bodies_are_the_api_servers_status_objects(cluster: Cluster):
    missing = raw(cluster, "GET", f"{SECRETS_PATH}/x")
    assert missing.status_code == 404
    assert missing.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'secrets "x" not found',
        "reason": "NotFound",
        "details": {"name": "x", "kind": "secrets"},
        "code": 404,
    }
    unauthenticated = raw(cluster, "GET", f"{SECRETS_PATH}/x", token=None)
    assert unauthenticated.status_code == 401
    assert unauthenticated.json() == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Unauthorized",
        "reason": "Unauthorized",
        "code": 401,
    }
    no_configuration = raw(cluster, "GET", f"{CONFIGURATION}/nope")
    assert no_configuration.json()["message"] == (
        'mutatingwebhookconfigurations.admissionregistration.k8s.io "nope" not found'
    )
    assert no_configuration.json()["details"] == {
        "name": "nope",
        "group": "admissionregistration.k8s.io",
        "kind": "mutatingwebhookconfigurations",
    }
    incomplete = raw(cluster, "POST", SECRETS_PATH, json=tls_secret(**{"tls.crt": "YQ=="}))
    assert incomplete.status_code == 422
    assert incomplete.json()["reason"] == "Invalid"
    assert (
        incomplete.json()["message"]
        == f'Secret "{SECRET}" is invalid: data[tls.key]: Required value'
    )


async def test_the_configuration_takes_a_json_patch_guarded_by_a_test_op(cluster: Cluster):
    async with KubeClient(cluster.credentials) as api:
        configuration = await api.get_webhook_configuration("effect-sidecar")
        version = configuration["metadata"]["resourceVersion"]
        guard = {"op": "test", "path": "/metadata/resourceVersion", "value": version}
        set_bundle = {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "Q0E="}
        patched = await api.patch_webhook_configuration("effect-sidecar", [guard, set_bundle])
        assert patched["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
        assert patched["metadata"]["resourceVersion"] != version
        assert patched["metadata"]["generation"] == configuration["metadata"]["generation"] + 1
        with pytest.raises(KubeApiError) as failed:
            await api.patch_webhook_configuration("effect-sidecar", [guard, set_bundle])
        assert (failed.value.status, failed.value.reason) == (422, "Invalid")
        assert failed.value.message == (
            "the server rejected our request due to an error in our request"
        )
    stored = cluster.api.get("mutatingwebhookconfigurations", "effect-sidecar")
    assert stored is not None
    assert stored["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="
    merge = raw(
        cluster,
        "PATCH",
        f"{CONFIGURATION}/effect-sidecar",
        content=b"{}",
        content_type="application/merge-patch+json",
    )
    assert merge.status_code == 415


async def test_a_refused_token_is_unauthorized_and_the_error_never_holds_it(
    cluster: Cluster, tmp_path: Path
):
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-the-token-8d1f")
    credentials = Credentials(cluster.server.url, cluster.server.ca_file, wrong)
    async with KubeClient(credentials) as api:
        with pytest.raises(KubeApiError) as refused:
            await api.get_secret(NAMESPACE, SECRET)
    assert (refused.value.status, refused.value.reason) == (401, "Unauthorized")
    assert "not-the-token-8d1f" not in str(refused.value)
    assert str(refused.value) == f"GET {SECRETS_PATH}/{SECRET}: 401 Unauthorized: Unauthorized"


async def test_the_token_file_is_read_for_each_request(cluster: Cluster):
    async with KubeClient(cluster.credentials) as api:
        await api.get_webhook_configuration("effect-sidecar")
        cluster.token_file.write_text("rotated-token")  # kubelet rotates projected tokens
        with pytest.raises(KubeApiError, match="401 Unauthorized"):
            await api.get_webhook_configuration("effect-sidecar")
        cluster.api.accept("rotated-token", ACCOUNT)
        await api.get_webhook_configuration("effect-sidecar")


async def test_rbac_names_what_is_forbidden_as_the_api_server_does(cluster: Cluster):
    cluster.api.grants = [
        Grant(
            ACCOUNT,
            NAMESPACE,
            (Rule(frozenset({"get"}), frozenset({""}), frozenset({SECRETS}), frozenset({SECRET})),),
        ),
    ]
    async with KubeClient(cluster.credentials) as api:
        assert await api.get_secret(NAMESPACE, SECRET) is None  # allowed; none there
        with pytest.raises(KubeApiError) as other:
            await api.get_secret(NAMESPACE, "someone-elses")
        assert (other.value.status, other.value.reason) == (403, "Forbidden")
        assert other.value.message == (
            f'secrets "someone-elses" is forbidden: User "{ACCOUNT}" cannot get resource '
            f'"secrets" in API group "" in the namespace "{NAMESPACE}"'
        )
        with pytest.raises(KubeApiError) as create:
            await api.create_secret(NAMESPACE, tls_secret())
        assert create.value.message == (
            f'secrets is forbidden: User "{ACCOUNT}" cannot create resource "secrets" in API '
            f'group "" in the namespace "{NAMESPACE}"'
        )
        with pytest.raises(KubeApiError) as patch:
            await api.patch_webhook_configuration("effect-sidecar", [])
        assert patch.value.message == (
            'mutatingwebhookconfigurations.admissionregistration.k8s.io "effect-sidecar" is '
            f'forbidden: User "{ACCOUNT}" cannot patch resource '
            '"mutatingwebhookconfigurations" in API group "admissionregistration.k8s.io" at '
            "the cluster scope"
        )


async def test_an_unreachable_or_untrusted_api_is_reported_as_such(
    cluster: Cluster, tmp_path: Path
):
    nowhere = Credentials(
        f"https://127.0.0.1:{free_port()}", cluster.server.ca_file, cluster.token_file
    )
    async with KubeClient(nowhere) as api:
        with pytest.raises(KubeApiError) as unreachable:
            await api.get_secret(NAMESPACE, SECRET)
    assert unreachable.value.reason == "Unreachable"
    assert nowhere.server in str(unreachable.value)

    other_ca = tmp_path / "other-ca.crt"
    other_ca.write_bytes(certs.cert_pem(certs.make_ca("someone else")[0]))
    untrusted = Credentials(cluster.server.url, other_ca, cluster.token_file)
    async with KubeClient(untrusted) as api:
        with pytest.raises(KubeApiError) as refused:
            await api.get_secret(NAMESPACE, SECRET)
    assert refused.value.reason == "Unreachable"
    assert "certificate verify failed" in str(refused.value)
    assert not any(r.path.endswith(SECRET) for r in cluster.api.requests()), (
        "no request got through"
    )
