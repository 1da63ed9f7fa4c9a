"""The mutating admission webhook: ``POST /mutate`` answers AdmissionReview v1 for Pods.

:func:`review` is the whole decision (an AdmissionReview in, the answering one out);
:func:`make_app` serves it, with ``GET /healthz``, and :func:`serve` runs it over TLS
(the API server only calls webhooks over HTTPS). A Pod CREATE that opts in gets
``allowed: true`` with a base64 JSON Patch from the pod as submitted to the injected
one; everything else (other kinds or operations, pods not opting in, already injected,
skipped) is allowed without a patch; an annotation that cannot be honoured is refused
(``allowed: false``, code 400, the message naming the annotation), so a bad pod is never
half-injected.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import signal
import ssl
from pathlib import Path
from typing import Any

import jsonpatch
from aiohttp import web

from sidecar.config import parse_listen
from sidecar.errors import ConfigError, InvalidInjection
from sidecar.kube.config import InjectConfig
from sidecar.kube.inject import inject

log = logging.getLogger("sidecar.kube.webhook")

API_VERSION = "admission.k8s.io/v1"
CONFIG: web.AppKey[InjectConfig] = web.AppKey("inject_config", InjectConfig)


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 with a request."""


def review(body: Any, config: InjectConfig) -> dict[str, Any]:
    """The AdmissionReview answering ``body``."""
    if not isinstance(body, dict) or body.get("apiVersion") != API_VERSION:
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}")
    request = body.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise BadReview("the AdmissionReview has no request.uid")
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = request.get("kind") or {}
    pod = request.get("object")
    if (
        kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and request.get("operation") == "CREATE"
        and isinstance(pod, dict)
    ):
        namespace = str(request.get("namespace") or (pod.get("metadata") or {}).get("namespace"))
        name = (pod.get("metadata") or {}).get("name") or (pod.get("metadata") or {}).get(
            "generateName", "?"
        )
        try:
            outcome = inject(pod, namespace, config)
        except InvalidInjection as error:
            log.warning("pod refused", extra={"namespace": namespace, "pod": name})
            response["allowed"] = False
            response["status"] = {
                "code": 400,
                "reason": "BadRequest",
                "message": f"effect-sidecar: {error.detail}",
            }
        else:
            if outcome.injected:
                patch = jsonpatch.make_patch(pod, outcome.manifest).patch
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
            log.info(
                "pod admitted",
                extra={"namespace": namespace, "pod": name, "outcome": outcome.reason},
            )
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


async def mutate(request: web.Request) -> web.Response:
    try:
        body = await request.json()
        answer = review(body, request.app[CONFIG])
    except ValueError as error:  # unparsable JSON, or BadReview
        return web.json_response({"error": str(error)}, status=400)
    return web.json_response(answer)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(config: InjectConfig) -> web.Application:
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[CONFIG] = config
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from exc
    return context


async def start(
    listen: str, cert: Path, key: Path, config: InjectConfig
) -> tuple[web.AppRunner, str]:
    """Listening over TLS; returns the runner (to clean up) and ``https://HOST:PORT``."""
    host, port = parse_listen(listen)
    context = tls_context(cert, key)
    runner = web.AppRunner(make_app(config), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {listen}: {exc}") from exc
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"https://{shown}:{bound_port}"


async def serve(listen: str, cert: Path, key: Path, config: InjectConfig) -> None:
    """Run until SIGTERM/SIGINT; prints ``effect-sidecar webhook ready https://...``."""
    runner, url = await start(listen, cert, key, config)
    print(f"effect-sidecar webhook ready {url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
