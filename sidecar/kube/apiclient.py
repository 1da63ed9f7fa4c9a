"""The few Kubernetes API calls the self-signed webhook makes, as the pod's service account.

Get, create and update a Secret of its namespace; get and JSON-Patch a
MutatingWebhookConfiguration. Plain aiohttp (already a dependency) against the REST
paths, rather than a client library: ``kubernetes_asyncio``, the maintained asyncio
client, is a 23 MB install of some 1,700 generated modules (plus urllib3, six,
python-dateutil, certifi) for these five requests, whose JSON the caller handles as
dicts anyway.

:class:`Credentials` is where the API is and how to prove who we are - in a pod, the
mounted service account (``/var/run/secrets/kubernetes.io/serviceaccount``) and
``KUBERNETES_SERVICE_HOST``/``PORT``. The token file is read for each request, because
kubelet rotates a projected token in place. The token goes into the ``Authorization``
header and nowhere else: :class:`KubeApiError` says the method, path, status and the
server's own message, never a header.
"""

from __future__ import annotations

import json
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
JSON_PATCH = "application/json-patch+json"
WEBHOOKS = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"


class KubeApiError(Exception):
    """A request that failed: the API answered with an error ``Status``, or not at all.

    ``reason`` is the Status's (``NotFound``, ``AlreadyExists``, ``Conflict``,
    ``Invalid``, ``Unauthorized``, ``Forbidden``, ...), or ``Unreachable`` /
    ``Credentials`` when no answer came.
    """

    def __init__(
        self, method: str, path: str, reason: str, message: str, status: int | None = None
    ) -> None:
        self.method, self.path, self.reason, self.message, self.status = (
            method,
            path,
            reason,
            message,
            status,
        )
        code = f"{status} {reason}" if status is not None else reason
        super().__init__(f"{method} {path}: {code}: {message}")


@dataclass(frozen=True)
class Credentials:
    """The API server's URL, the CA that signs its certificate and the bearer token file."""

    server: str
    ca_file: Path
    token_file: Path

    @classmethod
    def in_cluster(
        cls,
        server: str | None = None,
        ca_file: Path | None = None,
        token_file: Path | None = None,
        environ: dict[str, str] | None = None,
    ) -> Credentials:
        """The pod's own, each part overridable (tests point them at an emulator)."""
        if server is None:
            env = os.environ if environ is None else environ
            host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
            if not host or not port:
                raise ValueError(
                    "not in a pod (KUBERNETES_SERVICE_HOST/PORT are not set): give --kube-api"
                )
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
        return cls(
            server.rstrip("/"),
            ca_file or SERVICE_ACCOUNT / "ca.crt",
            token_file or SERVICE_ACCOUNT / "token",
        )


def pod_namespace(path: Path = SERVICE_ACCOUNT / "namespace") -> str:
    """The namespace the service account (so the pod) is in."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"cannot read the pod's namespace from {path}: {exc}") from exc


class KubeClient:
    """One session's worth of requests; ``async with KubeClient(credentials) as api:``."""

    def __init__(self, credentials: Credentials, timeout_s: float = 10.0) -> None:
        self.credentials = credentials
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeClient:
        try:
            # only the cluster's CA: the API server is never verified against public roots
            context = ssl.create_default_context(cafile=str(self.credentials.ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise KubeApiError(
                "-", self.credentials.server, "Credentials", f"cannot load the CA file: {exc}"
            ) from None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=context), timeout=self.timeout
        )
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """The JSON answer to ``method path``; :class:`KubeApiError` on any failure."""
        assert self._session is not None, "use KubeClient in 'async with'"
        try:
            token = self.credentials.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            reason = f"cannot read the token: {exc}"
            raise KubeApiError(method, path, "Credentials", reason) from None
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            headers["Content-Type"] = content_type
            data = json.dumps(body).encode()
        url = self.credentials.server + path
        try:
            async with self._session.request(method, url, data=data, headers=headers) as answer:
                text = await answer.text()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            # str(exc) names the host and port (or the TLS failure), never the headers
            detail = str(exc) or type(exc).__name__
            raise KubeApiError(
                method, path, "Unreachable", f"{self.credentials.server}: {detail}"
            ) from None
        try:
            parsed = json.loads(text) if text else {}
        except ValueError:
            parsed = {}
        if not isinstance(parsed, dict):
            parsed = {}
        if status >= 400:
            raise KubeApiError(
                method,
                path,
                str(parsed.get("reason") or "Unknown"),
                str(parsed.get("message") or text[:200] or "no message"),
                status,
            )
        return parsed

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or ``None`` if there is none of that name."""
        try:
            return await self.request("GET", f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except KubeApiError as error:
            if error.reason == "NotFound":
                return None
            raise

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any]:
        """POST it; an ``AlreadyExists`` error when another client created it first."""
        return await self.request("POST", f"/api/v1/namespaces/{namespace}/secrets", secret)

    async def update_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any]:
        """PUT it; with ``metadata.resourceVersion`` set, a ``Conflict`` error when the
        Secret changed since that version was read."""
        name = secret["metadata"]["name"]
        return await self.request("PUT", f"/api/v1/namespaces/{namespace}/secrets/{name}", secret)

    async def get_webhook_configuration(self, name: str) -> dict[str, Any]:
        return await self.request("GET", f"{WEBHOOKS}/{name}")

    async def patch_webhook_configuration(
        self, name: str, patch: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Apply a JSON Patch (RFC 6902); a failed ``test`` op is an ``Invalid`` error."""
        return await self.request("PATCH", f"{WEBHOOKS}/{name}", patch, JSON_PATCH)
