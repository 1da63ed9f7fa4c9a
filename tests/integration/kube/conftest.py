"""A Kubernetes API emulator over TLS (tests.support.kubeapi) with the webhook's service
account: its token file, the emulator's CA file, and the base MutatingWebhookConfiguration
of deploy/webhook as the cluster holds it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sidecar.kube.apiclient import Credentials
from tests.support.kubeapi import KubeApi, KubeApiServer, service_account

REPO = Path(__file__).resolve().parents[3]
NAMESPACE = "effect-sidecar-system"
ACCOUNT = service_account(NAMESPACE, "effect-sidecar-webhook")
# what an API server's token looks like; a test checks it never reaches a log
TOKEN = "eyJhbGciOiJSUzI1NiJ9.c2VjcmV0LXRva2VuLWZvci10ZXN0cw.sig-4f1c2a9e"


def base_configuration() -> dict:
    path = REPO / "deploy/webhook/base/mutatingwebhookconfiguration.yaml"
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@dataclass
class Cluster:
    api: KubeApi
    server: KubeApiServer
    token_file: Path

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.server.url, self.server.ca_file, self.token_file)

    def kube_args(self) -> list[str]:
        """``sidecar webhook``'s options that point it at this cluster."""
        return [
            "--kube-api",
            self.server.url,
            "--kube-ca-file",
            str(self.server.ca_file),
            "--kube-token-file",
            str(self.token_file),
            "--namespace",
            NAMESPACE,
        ]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    api = KubeApi(tokens={TOKEN: ACCOUNT})
    api.put(base_configuration())
    token_file = tmp_path / "sa" / "token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    with KubeApiServer(api, tmp_path / "kubeapi") as server:
        yield Cluster(api, server, token_file)
