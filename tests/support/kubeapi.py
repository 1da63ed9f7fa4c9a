"""A Kubernetes API server stand-in, for tests of the webhook's self-signed TLS mode.

Only the endpoints the webhook calls, answering as the real API server does - the same
paths, JSON shapes, status codes and ``Status`` error bodies:

* ``GET`` / ``PUT /api/v1/namespaces/{namespace}/secrets/{name}``,
  ``POST /api/v1/namespaces/{namespace}/secrets``;
* ``GET`` / ``PATCH
  /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{name}``, the
  patch as ``application/json-patch+json`` (RFC 6902, applied with ``jsonpatch``).

What it holds to, as the API server does:

* **Authentication**: ``Authorization: Bearer`` with one of ``tokens`` (token -> user
  name), else ``401 Unauthorized``, before anything else.
* **Authorization**, when ``grants`` are given (:func:`grants_from_manifests` reads them
  from rendered Roles, ClusterRoles and their bindings): RBAC's matching of verbs,
  apiGroups, resources and resourceNames - a rule with resourceNames never matches a
  create, whose request has no name - a Role's rules in its binding's namespace, a
  ClusterRole's everywhere; else ``403 Forbidden`` with the API server's message.
* **Versions**: every write bumps one cluster-wide ``resourceVersion`` (as etcd's
  revision does); an update that changes nothing writes nothing. A create of an existing
  name is ``409 AlreadyExists``; an update or patch that carries another
  ``resourceVersion`` than the current one is ``409 Conflict``; a JSON Patch operation
  that fails (a ``test`` among them) is ``422 Invalid``; a ``kubernetes.io/tls`` Secret
  without ``tls.crt`` or ``tls.key`` is ``422 Invalid``, and so is changing a Secret's
  ``type``.

:class:`KubeApiServer` serves it over TLS on 127.0.0.1 from a thread of its own (with a
test CA from :mod:`tests.support.certs`), so a test may block on child processes
meanwhile. What a test does to it - seed or read objects, accept or refuse a token, hold
requests at a barrier so that replicas race, read the request log - is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import ssl
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonpatch
import jsonpointer
from aiohttp import web

from sidecar.testing.served import ThreadedApp
from tests.support import certs

SECRETS = "secrets"
WEBHOOKS = "mutatingwebhookconfigurations"
GROUP = "admissionregistration.k8s.io"
JSON_PATCH = "application/json-patch+json"
HOLD_TIMEOUT_S = 10.0  # a barrier never reached lets its requests go after this

type Obj = dict[str, Any]
USER = web.RequestKey("user", str)
type Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Kind:
    resource: str
    group: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/v1" if self.group else "v1"

    @property
    def qualified(self) -> str:
        """How the API server names the resource in messages: ``secrets``,
        ``mutatingwebhookconfigurations.admissionregistration.k8s.io``."""
        return f"{self.resource}.{self.group}" if self.group else self.resource


KINDS = {
    SECRETS: Kind(SECRETS, "", "Secret", namespaced=True),
    WEBHOOKS: Kind(WEBHOOKS, GROUP, "MutatingWebhookConfiguration", namespaced=False),
}
BY_KIND = {kind.kind: kind for kind in KINDS.values()}


class Refused(Exception):
    """An error answer: the ``Status`` body the API server sends."""

    def __init__(
        self, code: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def response(self) -> web.Response:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return web.json_response(body, status=self.code)


def _details(kind: Kind, name: str = "") -> dict[str, Any]:
    """``StatusDetails`` for a resource, empty fields left out as Go's omitempty does."""
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if kind.group:
        details["group"] = kind.group
    details["kind"] = kind.resource
    return details


def not_found(kind: Kind, name: str) -> Refused:
    return Refused(404, "NotFound", f'{kind.qualified} "{name}" not found', _details(kind, name))


def already_exists(kind: Kind, name: str) -> Refused:
    message = f'{kind.qualified} "{name}" already exists'
    return Refused(409, "AlreadyExists", message, _details(kind, name))


def conflict(kind: Kind, name: str) -> Refused:
    message = (
        f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    return Refused(409, "Conflict", message, _details(kind, name))


def invalid(kind: Kind, name: str, causes: list[tuple[str, str, str]]) -> Refused:
    """``422 Invalid`` of a validation: causes are (field, reason, message)."""
    errors = [f"{where}: {message}" for where, _, message in causes]
    listed = errors[0] if len(errors) == 1 else f"[{', '.join(errors)}]"
    details = {
        "name": name,
        **({"group": kind.group} if kind.group else {}),
        "kind": kind.kind,
        "causes": [
            {"reason": reason, "message": message, "field": where}
            for where, reason, message in causes
        ],
    }
    return Refused(422, "Invalid", f'{kind.kind} "{name}" is invalid: {listed}', details)


def bad_request(message: str) -> Refused:
    return Refused(400, "BadRequest", message)


UNAUTHORIZED = Refused(401, "Unauthorized", "Unauthorized")


@dataclass(frozen=True)
class Rule:
    """One RBAC PolicyRule."""

    verbs: frozenset[str]
    api_groups: frozenset[str]
    resources: frozenset[str]
    resource_names: frozenset[str] = frozenset()

    @classmethod
    def of(cls, rule: Obj) -> Rule:
        return cls(
            frozenset(rule.get("verbs") or ()),
            frozenset(rule.get("apiGroups") or ()),
            frozenset(rule.get("resources") or ()),
            frozenset(rule.get("resourceNames") or ()),
        )

    def allows(self, verb: str, group: str, resource: str, name: str) -> bool:
        return (
            (verb in self.verbs or "*" in self.verbs)
            and (group in self.api_groups or "*" in self.api_groups)
            and (resource in self.resources or "*" in self.resources)
            # a create has no name, so a rule naming resources never allows one
            and (not self.resource_names or name in self.resource_names)
        )


@dataclass(frozen=True)
class Grant:
    """Rules bound to a user, in one namespace (a RoleBinding) or everywhere (``None``)."""

    user: str
    namespace: str | None
    rules: tuple[Rule, ...]


def permits(
    grants: Iterable[Grant], user: str, verb: str, kind: Kind, namespace: str, name: str
) -> bool:
    """Whether ``user`` may ``verb`` the object (``name`` is empty for a create, a list);
    ``namespace`` is ignored for a cluster-scoped ``kind``."""
    for grant in grants:
        if grant.user != user:
            continue
        # a RoleBinding's rules hold in its namespace, never for cluster-scoped objects
        if grant.namespace is not None and (not kind.namespaced or grant.namespace != namespace):
            continue
        if any(rule.allows(verb, kind.group, kind.resource, name) for rule in grant.rules):
            return True
    return False


def service_account(namespace: str, name: str) -> str:
    """The user name a service account's token authenticates as."""
    return f"system:serviceaccount:{namespace}:{name}"


def grants_from_manifests(objects: Iterable[Obj]) -> list[Grant]:
    """The grants that rendered Roles, ClusterRoles and their bindings make."""
    objects = list(objects)
    roles: dict[tuple[str, str], tuple[Rule, ...]] = {}
    cluster_roles: dict[str, tuple[Rule, ...]] = {}
    for obj in objects:
        rules = tuple(Rule.of(rule) for rule in obj.get("rules") or ())
        if obj["kind"] == "Role":
            roles[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = rules
        elif obj["kind"] == "ClusterRole":
            cluster_roles[obj["metadata"]["name"]] = rules
    grants = []
    for obj in objects:
        if obj["kind"] not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        namespace = obj["metadata"].get("namespace") if obj["kind"] == "RoleBinding" else None
        ref = obj["roleRef"]
        if ref["kind"] == "Role" and namespace is not None:
            rules = roles.get((namespace, ref["name"]), ())
        else:
            rules = cluster_roles.get(ref["name"], ())
        for subject in obj.get("subjects") or ():
            if subject["kind"] == "ServiceAccount":
                user = service_account(subject.get("namespace") or namespace or "", subject["name"])
            else:
                user = subject["name"]
            grants.append(Grant(user, namespace, rules))
    return grants


@dataclass(frozen=True)
class Recorded:
    """One request as the log keeps it (never its headers)."""

    method: str
    path: str
    status: int
    user: str | None


@dataclass
class _Barrier:
    needed: int
    arrived: int = 0
    event: asyncio.Event | None = None


@dataclass
class KubeApi:
    """The state and the aiohttp application; see the module's docstring."""

    tokens: dict[str, str] = field(default_factory=dict)
    grants: list[Grant] | None = None  # None: every authenticated user may do anything
    objects: dict[tuple[str, str, str], Obj] = field(default_factory=dict)
    log: list[Recorded] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1000))
    _barriers: dict[tuple[str, str], _Barrier] = field(default_factory=dict)

    # --- what a test does to it (any thread) ---

    def accept(self, token: str, user: str) -> None:
        """Let ``token`` authenticate as ``user`` from now on."""
        with self._lock:
            self.tokens[token] = user

    def revoke(self, token: str) -> None:
        """Refuse ``token`` from now on (``401``)."""
        with self._lock:
            self.tokens.pop(token, None)

    def put(self, obj: Obj) -> Obj:
        """Store ``obj`` as it is (created or replaced, a new version); returns the stored."""
        kind = BY_KIND[obj["kind"]]
        meta = obj.setdefault("metadata", {})
        with self._lock:
            key = (
                kind.resource,
                meta.get("namespace", "") if kind.namespaced else "",
                meta["name"],
            )
            old = self.objects.get(key)
            stored = self._stamp(kind, _wire(obj), old)
            self.objects[key] = stored
            return _wire(stored)

    def get(self, resource: str, name: str, namespace: str = "") -> Obj | None:
        with self._lock:
            found = self.objects.get((resource, namespace, name))
            return _wire(found)

    def requests(self) -> list[Recorded]:
        with self._lock:
            return list(self.log)

    def hold(self, method: str, resource: str, count: int) -> None:
        """Hold the next ``count`` ``method`` requests on ``resource`` until all of them
        have arrived, then answer them together: replicas reading at the same moment."""
        with self._lock:
            self._barriers[(method, resource)] = _Barrier(count)

    # --- the application ---

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record, self._authenticate])
        namespaced = "/api/v1/namespaces/{namespace}/secrets"
        webhooks = f"/apis/{GROUP}/v1/{WEBHOOKS}/{{name}}"
        app.router.add_get(namespaced + "/{name}", self._get_secret)
        app.router.add_put(namespaced + "/{name}", self._update_secret)
        app.router.add_post(namespaced, self._create_secret)
        app.router.add_get(webhooks, self._get_webhooks)
        app.router.add_patch(webhooks, self._patch_webhooks)
        return app

    @web.middleware
    async def _record(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except Refused as refused:
            response = refused.response()
        except web.HTTPNotFound:
            response = Refused(
                404, "NotFound", "the server could not find the requested resource", {}
            ).response()
        except web.HTTPMethodNotAllowed:
            message = "the server does not allow this method on the requested resource"
            response = Refused(405, "MethodNotAllowed", message, {}).response()
        except Exception as exc:  # an emulator bug: answered as the API server's 500 is
            response = Refused(500, "InternalError", f"Internal error occurred: {exc}").response()
        with self._lock:
            user = request.get(USER)
            self.log.append(Recorded(request.method, request.path, response.status, user))
        return response

    @web.middleware
    async def _authenticate(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        with self._lock:
            user = self.tokens.get(token) if scheme.lower() == "bearer" and token else None
        if user is None:
            raise UNAUTHORIZED
        request[USER] = user
        return await handler(request)

    def _authorize(
        self, request: web.Request, verb: str, kind: Kind, namespace: str, name: str
    ) -> None:
        user = request[USER]
        with self._lock:
            grants = self.grants
        if grants is None or permits(grants, user, verb, kind, namespace, name):
            return
        what = f'{kind.qualified} "{name}"' if name else kind.qualified
        where = f'in the namespace "{namespace}"' if kind.namespaced else "at the cluster scope"
        message = (
            f'{what} is forbidden: User "{user}" cannot {verb} resource "{kind.resource}" '
            f'in API group "{kind.group}" {where}'
        )
        raise Refused(403, "Forbidden", message, _details(kind, name))

    async def _pass_barrier(self, method: str, resource: str) -> None:
        with self._lock:
            barrier = self._barriers.get((method, resource))
            if barrier is None or barrier.arrived >= barrier.needed:
                return
            barrier.arrived += 1
            if barrier.event is None:
                barrier.event = asyncio.Event()
            event = barrier.event
            if barrier.arrived == barrier.needed:
                event.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), HOLD_TIMEOUT_S)

    async def _body(self, request: web.Request) -> Any:
        try:
            return json.loads(await request.read())
        except ValueError as exc:
            raise bad_request(f"the body of the request could not be decoded: {exc}") from None

    # --- Secrets ---

    async def _get_secret(self, request: web.Request) -> web.Response:
        kind, namespace, name = (
            KINDS[SECRETS],
            request.match_info["namespace"],
            request.match_info["name"],
        )
        self._authorize(request, "get", kind, namespace, name)
        await self._pass_barrier("GET", SECRETS)
        with self._lock:
            found = self.objects.get((SECRETS, namespace, name))
            if found is None:
                raise not_found(kind, name)
            return web.json_response(found)

    async def _create_secret(self, request: web.Request) -> web.Response:
        kind, namespace = KINDS[SECRETS], request.match_info["namespace"]
        self._authorize(request, "create", kind, namespace, "")
        body = await self._body(request)
        await self._pass_barrier("POST", SECRETS)
        secret = self._typed(body, kind)
        meta = secret["metadata"]
        if meta.setdefault("namespace", namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        name = meta.get("name") or ""
        if not name:
            raise invalid(
                kind,
                "",
                [
                    (
                        "metadata.name",
                        "FieldValueRequired",
                        "Required value: name or generateName is required",
                    )
                ],
            )
        secret.setdefault("type", "Opaque")
        self._validate_secret(secret, None)
        with self._lock:
            if (SECRETS, namespace, name) in self.objects:
                raise already_exists(kind, name)
            stored = self._stamp(kind, secret, None)
            self.objects[(SECRETS, namespace, name)] = stored
            return web.json_response(stored, status=201)

    async def _update_secret(self, request: web.Request) -> web.Response:
        kind, namespace, name = (
            KINDS[SECRETS],
            request.match_info["namespace"],
            request.match_info["name"],
        )
        self._authorize(request, "update", kind, namespace, name)
        body = await self._body(request)
        await self._pass_barrier("PUT", SECRETS)
        secret = self._typed(body, kind)
        meta = secret["metadata"]
        if meta.get("name") != name:
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the "
                f"URL ({name})"
            )
        if meta.setdefault("namespace", namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        secret.setdefault("type", "Opaque")
        with self._lock:
            current = self.objects.get((SECRETS, namespace, name))
            if current is None:
                raise not_found(kind, name)
            version = meta.get("resourceVersion")
            # Secrets allow an unconditional update (no resourceVersion); a stale one loses
            if version and version != current["metadata"]["resourceVersion"]:
                raise conflict(kind, name)
            self._validate_secret(secret, current)
            stored = self._stamp(kind, secret, current)
            self.objects[(SECRETS, namespace, name)] = stored
            return web.json_response(stored)

    def _validate_secret(self, secret: Obj, current: Obj | None) -> None:
        name = secret["metadata"]["name"]
        causes = []
        if current is not None and secret["type"] != current["type"]:
            causes.append(
                (
                    "type",
                    "FieldValueInvalid",
                    f'Invalid value: "{secret["type"]}": field is immutable',
                )
            )
        if secret["type"] == "kubernetes.io/tls":
            data = secret.get("data") or {}
            causes += [
                (f"data[{key}]", "FieldValueRequired", "Required value")
                for key in ("tls.crt", "tls.key")
                if key not in data
            ]
        if causes:
            raise invalid(KINDS[SECRETS], name, causes)

    # --- MutatingWebhookConfigurations ---

    async def _get_webhooks(self, request: web.Request) -> web.Response:
        kind, name = KINDS[WEBHOOKS], request.match_info["name"]
        self._authorize(request, "get", kind, "", name)
        await self._pass_barrier("GET", WEBHOOKS)
        with self._lock:
            found = self.objects.get((WEBHOOKS, "", name))
            if found is None:
                raise not_found(kind, name)
            return web.json_response(found)

    async def _patch_webhooks(self, request: web.Request) -> web.Response:
        kind, name = KINDS[WEBHOOKS], request.match_info["name"]
        self._authorize(request, "patch", kind, "", name)
        if request.content_type != JSON_PATCH:
            raise Refused(
                415,
                "UnsupportedMediaType",
                "the body of the request was in an unknown format - accepted media types "
                f"include: {JSON_PATCH}",  # the emulator models JSON Patch only
            )
        body = await self._body(request)
        await self._pass_barrier("PATCH", WEBHOOKS)
        try:
            patch = jsonpatch.JsonPatch(body)
        except (jsonpatch.InvalidJsonPatch, TypeError, AttributeError) as exc:
            raise bad_request(str(exc)) from None
        with self._lock:
            current = self.objects.get((WEBHOOKS, "", name))
            if current is None:
                raise not_found(kind, name)
            try:
                patched = patch.apply(_wire(current))
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException):
                # what the API server answers to any failed operation, a test op's too
                raise Refused(
                    422,
                    "Invalid",
                    "the server rejected our request due to an error in our request",
                    {},
                ) from None
            version = (patched.get("metadata") or {}).get("resourceVersion")
            if version and version != current["metadata"]["resourceVersion"]:
                raise conflict(kind, name)
            stored = self._stamp(kind, patched, current)
            self.objects[(WEBHOOKS, "", name)] = stored
            return web.json_response(stored)

    # --- shared ---

    def _typed(self, body: Any, kind: Kind) -> Obj:
        """The body as an object of ``kind`` (apiVersion and kind defaulted from the URL)."""
        if not isinstance(body, dict):
            raise bad_request(f"the object provided is unrecognized (must be of type {kind.kind})")
        if (
            body.setdefault("kind", kind.kind) != kind.kind
            or body.setdefault("apiVersion", kind.api_version) != kind.api_version
        ):
            raise bad_request(
                f"the object provided is unrecognized (must be of type {kind.kind}): "
                f"{body.get('apiVersion')}, Kind={body.get('kind')}"
            )
        if not isinstance(body.setdefault("metadata", {}), dict):
            raise bad_request("metadata must be an object")
        return body

    def _stamp(self, kind: Kind, obj: Obj, current: Obj | None) -> Obj:
        """``obj`` as stored over ``current`` (call under the lock): the server's metadata,
        a new resourceVersion - unless nothing changed, which is not a write."""
        meta = obj["metadata"]
        if current is not None:
            old = current["metadata"]
            for server_set in ("uid", "creationTimestamp", "generation"):
                if server_set in old:
                    meta[server_set] = old[server_set]
            meta["resourceVersion"] = old["resourceVersion"]
            if obj == current:
                return current
            if kind.kind != "Secret" and _spec(obj) != _spec(current):
                meta["generation"] = old.get("generation", 1) + 1
        else:
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            if kind.kind != "Secret":
                meta["generation"] = 1
        meta["resourceVersion"] = str(next(self._versions))
        return obj


def _wire[T: (Obj, Obj | None)](obj: T) -> T:
    """A copy as it would cross the wire: JSON, so no two parts of it are one object."""
    copied: T = json.loads(json.dumps(obj))
    return copied


def _spec(obj: Obj) -> Obj:
    return {key: value for key, value in obj.items() if key != "metadata"}


class KubeApiServer:
    """``api`` over TLS on 127.0.0.1, from a thread of its own; a context manager.

    ``url`` is where it listens and ``ca_file`` the test CA a client must trust.
    """

    def __init__(self, api: KubeApi, directory: Path) -> None:
        self.api = api
        self.directory = directory
        self.url = ""
        self.ca_file = directory / "kube-ca.crt"
        self._served: ThreadedApp | None = None

    def __enter__(self) -> KubeApiServer:
        ca_cert, ca_key = certs.make_ca("kubeapi emulator CA")
        cert, key = certs.issue(ca_cert, ca_key, "kube-apiserver", ip="127.0.0.1")
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca_file.write_bytes(certs.cert_pem(ca_cert))
        cert_file, key_file = certs.write_ca(self.directory / "kube-serving", cert, key)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        self._served = ThreadedApp(self.api.app(), ssl_context=context)
        self.url = self._served.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._served is not None:
            self._served.__exit__(*exc_info)
