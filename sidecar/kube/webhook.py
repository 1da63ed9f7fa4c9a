"""The mutating admission webhook: ``POST /mutate`` answers AdmissionReview v1 for Pods.

:func:`review` is the whole decision (an AdmissionReview in, the answering one out);
:func:`make_app` serves it, with ``GET /healthz``, and :func:`serve` runs it over TLS
(the API server only calls webhooks over HTTPS), reloading its certificate when the
files change (:class:`CertReloader`); a :class:`TLSProvider` may make those files first
(the self-signed mode, :mod:`sidecar.kube.selfsigned`).

The answers, so that what a user sees in ``kubectl`` says what is wrong:

* a Pod CREATE that opts in gets ``allowed: true`` with a base64 JSON Patch from the pod
  as submitted to the injected one, and ``warnings`` (kubectl prints them) for what the
  injection could not fix: a CA variable the app sets itself, a Job that will not end;
* a workload CREATE (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob), if
  the webhook's configuration routes it here, is never patched (its pods are) but is
  refused or warned as its pods would be - a Job whose pods share one task, say - so
  ``kubectl apply`` shows it rather than only the controller;
* everything else (other kinds or operations, not opting in, already injected, skipped)
  is allowed without a patch;
* a pod that cannot be injected as it asks - a bad annotation, ``hostNetwork`` without
  the opt-out, a field of the wrong shape - is refused (``allowed: false``, code 400, the
  message naming the annotation or field), so a bad pod is never half-injected;
* a body that is not an AdmissionReview v1 at all (not JSON, nested absurdly deep, no
  ``request.uid``, a ``request.kind`` that is not an object) is a 400
  ``application/problem+json``: there is no review to answer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import tempfile
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

import jsonpatch
from aiohttp import web

from sidecar.config import parse_listen
from sidecar.control.problems import problem_middleware
from sidecar.errors import ConfigError, InvalidInjection, InvalidRequest
from sidecar.kube.config import InjectConfig
from sidecar.kube.inject import inject
from sidecar.kube.shape import describe
from sidecar.runtime.aio import stop_on_signals
from sidecar.runtime.tls import server_context

log = logging.getLogger("sidecar.kube.webhook")

API_VERSION = "admission.k8s.io/v1"
CONFIG: web.AppKey[InjectConfig] = web.AppKey("inject_config", InjectConfig)
#: The workloads reviewed but never patched, by kind, with their API group.
WORKLOADS = {
    "Deployment": "apps",
    "StatefulSet": "apps",
    "DaemonSet": "apps",
    "ReplicaSet": "apps",
    "Job": "batch",
    "CronJob": "batch",
}


class BadReview(InvalidRequest, title="Not an AdmissionReview v1"):
    """The body is not an AdmissionReview v1 with a request."""


def parse(raw: bytes) -> Any:
    """The body as JSON, or :class:`BadReview`."""
    try:
        return json.loads(raw)
    except RecursionError:  # json.loads recurses once per level of nesting
        raise BadReview("the body is nested too deeply to be an AdmissionReview") from None
    except ValueError as exc:  # includes UnicodeDecodeError
        raise BadReview(f"the body is not JSON: {exc}") from None


def _object(value: Any, where: str, what: str = "an object") -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadReview(f"{where}: expected {what}, got {describe(value)}")
    return value


def _string(value: Any, where: str, *, empty: bool = True) -> None:
    if not isinstance(value, str) or not (empty or value):
        what = "a string" if empty else "a non-empty string"
        raise BadReview(f"{where}: expected {what}, got {describe(value)}")


def _request(body: Any) -> dict[str, Any]:
    """``body.request``, with the fields the decision reads checked."""
    if (
        not isinstance(body, dict)
        or body.get("apiVersion") != API_VERSION
        or body.get("kind") != "AdmissionReview"
    ):
        raise BadReview(f"expected an AdmissionReview of {API_VERSION}")
    request = _object(body.get("request"), "request")
    _string(request.get("uid"), "request.uid", empty=False)
    kind = _object(request.get("kind"), "request.kind", "an object {group, version, kind}")
    _string(kind.get("kind"), "request.kind.kind")
    _string(kind.get("group", ""), "request.kind.group")
    _string(request.get("operation"), "request.operation")
    _string(request.get("namespace") or "", "request.namespace")
    return request


def _reviewed(request: dict[str, Any]) -> str | None:
    """The kind under review if this webhook decides on it: a Pod or a workload CREATE."""
    kind: str = request["kind"]["kind"]
    group: str = request["kind"].get("group", "")
    if request["operation"] != "CREATE":
        return None
    if (group, kind) == ("", "Pod") or WORKLOADS.get(kind) == group:
        return kind
    return None


def review(body: Any, config: InjectConfig) -> dict[str, Any]:
    """The AdmissionReview answering ``body``; :class:`BadReview` if it is not one."""
    request = _request(body)
    response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
    kind = _reviewed(request)
    if kind is not None:
        response.update(_decide(request, kind, config))
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _denied(message: str) -> dict[str, Any]:
    return {
        "allowed": False,
        "status": {"code": 400, "reason": "BadRequest", "message": f"effect-sidecar: {message}"},
    }


def _decide(request: dict[str, Any], kind: str, config: InjectConfig) -> dict[str, Any]:
    """What to answer for a Pod (patched) or a workload (never patched) being created."""
    submitted = request.get("object")
    if not isinstance(submitted, dict):
        return _denied(f"request.object: expected an object (a {kind}), got {describe(submitted)}")
    # The API server sends the object with its kind; inject() goes by it.
    manifest = submitted if submitted.get("kind") == kind else {**submitted, "kind": kind}
    metadata = manifest.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}  # inject() refuses the rest
    namespace = request.get("namespace") or metadata.get("namespace") or "default"
    where = {"namespace": str(namespace), "kind": kind, "object": _name(metadata)}
    try:
        outcome = inject(manifest, str(namespace), config)
    except InvalidInjection as error:
        log.warning("refused", extra={**where, "error": error.detail})
        return _denied(error.detail)
    answer: dict[str, Any] = {}
    if outcome.injected and kind == "Pod":
        patch = jsonpatch.make_patch(manifest, outcome.manifest).patch
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if outcome.warnings:
        answer["warnings"] = list(outcome.warnings)  # kubectl prints them
    log.info("admitted", extra={**where, "outcome": outcome.reason})
    return answer


def _name(metadata: dict[str, Any]) -> str:
    return str(metadata.get("name") or metadata.get("generateName") or "?")


async def mutate(request: web.Request) -> web.Response:
    # BadReview and aiohttp's own errors (a body over the size limit) become problem+json
    # in the middleware.
    body = parse(await request.read())
    return web.json_response(review(body, request.app[CONFIG]))


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def make_app(config: InjectConfig) -> web.Application:
    app = web.Application(client_max_size=8 * 1024 * 1024, middlewares=[problem_middleware])
    app[CONFIG] = config
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


DEFAULT_RELOAD_S = 10.0

# what identifies one version of a file: the path its symlinks resolve to, then
# (mtime_ns, size, inode, device) of that file
Stamp = tuple[tuple[str, int, int, int, int], ...]


def stamp(*paths: Path) -> Stamp:
    """The version of each file, following symlinks (kubelet swaps ``..data``)."""
    parts = []
    for path in paths:
        resolved = path.resolve()
        info = resolved.stat()
        parts.append((str(resolved), info.st_mtime_ns, info.st_size, info.st_ino, info.st_dev))
    return tuple(parts)


class CertReloader:
    """Reloads ``context``'s certificate when the cert or key file changes.

    :meth:`check` stats the resolved files; when they differ from those last loaded it
    reads both once, checks they load as a matching pair into a scratch context, and only
    then calls ``load_cert_chain`` on the live ``context`` with those same bytes: new
    handshakes use the new certificate, established connections keep theirs. A pair that
    is missing, half-written or mismatched is logged as a warning and the old certificate
    kept; the next check tries again. (Loading an unchecked pair into the live context
    could leave it with the new certificate and no key.)
    """

    def __init__(
        self, context: ssl.SSLContext, cert: Path, key: Path, loaded: Stamp | None = None
    ) -> None:
        """``loaded``: the :func:`stamp` of the files ``context`` holds now, if known."""
        self.context = context
        self.cert = cert
        self.key = key
        self.loaded = loaded
        self.reloads = 0  # certificates taken since the start
        self.rejected = 0  # checks that found changed files but could not take them
        self._warned: Stamp | str | None = None

    def check(self) -> bool:
        """Reload if the files changed and load as a pair; True when it reloaded."""
        try:
            current = stamp(self.cert, self.key)
        except OSError as exc:
            self._reject(f"cannot stat: {exc}", str(exc))
            return False
        if current == self.loaded:
            return False
        try:
            cert_pem, key_pem = self.cert.read_bytes(), self.key.read_bytes()
            with tempfile.TemporaryDirectory(prefix="sidecar-tls-") as directory:
                cert_copy, key_copy = Path(directory, "tls.crt"), Path(directory, "tls.key")
                cert_copy.write_bytes(cert_pem)
                key_fd = os.open(key_copy, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(key_fd, "wb") as key_file:
                    key_file.write(key_pem)
                ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_copy, key_copy)
                self.context.load_cert_chain(cert_copy, key_copy)
        except (OSError, ssl.SSLError) as exc:
            self._reject(str(exc), current)
            return False
        self.loaded = current
        self.reloads += 1
        self._warned = None
        log.info("TLS certificate reloaded", extra={"cert": str(self.cert), "key": str(self.key)})
        return True

    def _reject(self, reason: str, seen: Stamp | str) -> None:
        self.rejected += 1
        # once per version of the files, not every tick while they stay broken
        level = logging.DEBUG if seen == self._warned else logging.WARNING
        self._warned = seen
        log.log(
            level,
            "TLS certificate not reloaded, keeping the old one",
            extra={"cert": str(self.cert), "key": str(self.key), "error": reason},
        )

    async def run(self, interval: float) -> None:
        """:meth:`check` every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.check()
            except Exception:  # a bug here must not stop the webhook serving
                log.exception("TLS certificate check failed")

    def watching(self, interval: float) -> Callable[[web.Application], AsyncIterator[None]]:
        """An aiohttp cleanup context running :meth:`run` for the app's lifetime."""

        async def context(app: web.Application) -> AsyncIterator[None]:
            task = asyncio.create_task(self.run(interval), name="sidecar-tls-reload")
            yield
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        return context


RELOADER: web.AppKey[CertReloader] = web.AppKey("cert_reloader", CertReloader)


async def start(
    listen: str,
    cert: Path,
    key: Path,
    config: InjectConfig,
    reload_s: float = DEFAULT_RELOAD_S,
) -> tuple[web.AppRunner, str]:
    """Listening over TLS; returns the runner (to clean up) and ``https://HOST:PORT``.

    The certificate files are checked every ``reload_s`` seconds (the app's
    :data:`RELOADER`) and a renewed pair is served to new connections.
    """
    if not reload_s > 0:  # also refuses nan
        raise ConfigError(f"the certificate reload interval must be positive, not {reload_s}")
    host, port = parse_listen(listen)
    try:  # before loading: a change in between is then seen by the first check
        loaded: Stamp | None = stamp(cert, key)
    except OSError:
        loaded = None
    context = server_context(cert, key)
    app = make_app(config)
    reloader = CertReloader(context, cert, key, loaded)
    app[RELOADER] = reloader
    app.cleanup_ctx.append(reloader.watching(reload_s))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, ssl_context=context).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot listen on {listen}: {exc}") from exc
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return runner, f"https://{shown}:{bound_port}"


class TLSProvider(Protocol):
    """Makes the certificate files the webhook serves (the self-signed mode's
    :class:`sidecar.kube.selfsigned.SelfSignedTLS`)."""

    async def ensure(self) -> object:
        """Return once the files are in place (retrying as long as it takes)."""
        ...

    async def maintain(self, changed: Callable[[], object]) -> None:
        """Keep them current until cancelled; call ``changed`` after replacing them."""
        ...


async def serve(
    listen: str,
    cert: Path,
    key: Path,
    config: InjectConfig,
    reload_s: float = DEFAULT_RELOAD_S,
    provider: TLSProvider | None = None,
) -> None:
    """Run until SIGTERM/SIGINT; prints ``effect-sidecar webhook ready https://...``.

    With a ``provider`` the files are its to make: nothing listens until
    :meth:`TLSProvider.ensure` has returned (so ``/healthz`` does not answer, and the pod
    is not ready, before there is a certificate), then it maintains them.
    """
    stop = asyncio.Event()
    stop_on_signals(stop)
    if provider is not None and not await _until_stopped(provider.ensure(), stop):
        return
    runner, url = await start(listen, cert, key, config, reload_s)
    maintaining = None
    if provider is not None:
        reloader = runner.app[RELOADER]
        maintaining = asyncio.create_task(provider.maintain(reloader.check), name="sidecar-tls")
    print(f"effect-sidecar webhook ready {url}", flush=True)
    try:
        await stop.wait()
    finally:
        if maintaining is not None:
            maintaining.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await maintaining
        await runner.cleanup()


async def _until_stopped(work: Coroutine[Any, Any, object], stop: asyncio.Event) -> bool:
    """Run ``work`` unless ``stop`` is set first; True if it finished."""
    task = asyncio.ensure_future(work)
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False
    task.result()  # its exception, if any
    return True
