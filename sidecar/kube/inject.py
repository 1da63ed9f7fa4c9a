"""Injecting the sidecar into a Pod or a workload's pod template (pure: no I/O).

:func:`inject` takes a manifest (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
CronJob), its namespace and an :class:`InjectConfig`, and returns a new manifest; the
input is never modified. Pods opt in with ``effect-sidecar.io/inject: "true"`` (label or
annotation on the pod template). Not injected, returned as they came: pods that do not
opt in, pods already carrying ``effect-sidecar.io/status`` (so a second injection, or a
webhook reinvoked with ``reinvocationPolicy: IfNeeded``, changes nothing), and pods in
``kube-system``, ``kube-public``, ``kube-node-lease`` and the injector's own namespace
(checked first, so a system pod is never refused). Refused with :class:`InvalidInjection`,
nothing changed: a field injection reads holding the wrong shape, or a manifest nested
deeper than any object (:mod:`sidecar.kube.shape`), a bad ``effect-sidecar.io/*`` value,
a ``hostNetwork`` pod (its network is the node's: the redirect's iptables rules would
capture the whole node's traffic, so the sidecar cannot protect it) unless it says
``effect-sidecar.io/allow-host-network: "true"`` - then it is admitted as it came, with
:data:`HOST_NETWORK_WARNING` -, a container already named ``effect-sidecar`` or
``effect-sidecar-redirect`` (without the status annotation), a volume name or a mount at
``/var/run/effect-sidecar`` already taken, and in transparent mode an app running as the
sidecar's UID (the redirect exempts that UID, so the app would bypass the sidecar).
The :class:`Outcome` carries warnings (the webhook's AdmissionReview ``warnings``,
``sidecar inject``'s stderr) for what injection cannot fix itself.

What an injected pod gets:

* ``effect-sidecar``, the sidecar, running ``sidecar serve`` as UID 1337 with no
  capabilities and a read-only root filesystem. Native sidecar (default; Kubernetes
  1.29+): an ``initContainers`` entry with ``restartPolicy: Always`` whose startupProbe
  (``GET /readyz`` on 7300) holds back the later init containers and the app until the
  sidecar is ready; kubelet stops it after the app containers end, so a Job completes.
  ``/readyz`` answers 200 only once the CA bundle is written, the proxy's gate is open,
  the PostgreSQL relay listens, the task's lease is held (a new pod waits out the lease
  of the one it replaces) and the store took a durable test write
  (:mod:`sidecar.serve.readiness`). Fallback (``effect-sidecar.io/native-sidecar: "false"`` or
  ``native_sidecar: false``): the FIRST regular container, with a ``postStart`` hook that
  polls ``/readyz``; kubelet starts the next container only when that hook returns. **A
  Job does not complete by itself in that shape**: the pod ends only when every container
  has exited, so the agent's command must end with ``POST /v1/shutdown`` to the sidecar
  (deploy/README.md has the lines); :data:`JOB_END_WARNING` says so (the webhook's
  AdmissionReview warning, ``sidecar inject``'s stderr). In the fallback shape the pod's
  own init containers run before the sidecar
  exists: they get neither the CA variables nor the proxy variables (the bundle does not
  exist yet), and in transparent mode the redirect container is placed after them so
  their traffic is not sent to a proxy that is not listening.
* ``effect-sidecar-redirect`` (transparent mode, the default): an init container before
  the sidecar running ``sidecar redirect`` (NET_ADMIN, NET_RAW, as root, nothing else)
  with the pod's ``*-outbound-cidrs``/``*-outbound-ports``/``pg-ports`` annotations. The
  proxy listens on ``127.0.0.1:7301``: ``REDIRECT`` in ``nat OUTPUT`` rewrites a locally
  generated connection's destination to the loopback address, where mitmproxy accepts it
  and reads the original destination (``SO_ORIGINAL_DST``); listening on ``0.0.0.0`` would
  offer an open proxy acting for the pod's task to the whole cluster network.
  ``env-proxy`` mode needs no privilege: no redirect container, the app containers get
  ``HTTP_PROXY``/``HTTPS_PROXY`` (both cases: curl reads only the lower-case ones) set to
  ``http://127.0.0.1:7301`` and ``NO_PROXY`` for loopback. ``DATABASE_URL`` is left to
  the operator in both modes: point it at ``postgresql://...@127.0.0.1:7302/DB`` in
  env-proxy mode (transparent mode redirects the PostgreSQL ports itself).
* CA trust on every app container (and, with native sidecars, every other init
  container): an emptyDir of its own, ``effect-sidecar-trust``, where the sidecar writes
  ``ca-bundle.pem`` (``--ca-bundle``), mounted read-only at ``/var/run/effect-sidecar-trust``,
  and ``SSL_CERT_FILE``, ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, ``NODE_EXTRA_CA_CERTS``,
  ``GIT_SSL_CAINFO``, ``PIP_CERT``, ``AWS_CA_BUNDLE`` and ``PGSSLROOTCERT`` (libpq: so
  ``sslmode=verify-full`` verifies the PostgreSQL relay) pointing at it. A variable the
  container already sets is **kept** (the operator's explicit value wins; the status
  annotation lists what was kept), and each CA variable kept with a value other than the
  bundle is warned about, naming the container and the variable: that client's TLS
  through the sidecar fails unless its own bundle has the sidecar's CA. The sidecar's
  data volume (the CA key, the SQLite store) is mounted in the sidecar alone: not even a
  root app can read the key.
* a shared CA (``ca_secret``: a TLS Secret's name): the Secret mounted read-only at
  ``/etc/effect-sidecar/ca`` (``tls.crt``, ``tls.key``) in the sidecar container alone,
  and ``--ca-from`` that directory; ``sidecar serve`` copies the CA into the data volume's
  ``ca/``, so every pod of the namespace intercepts with the same CA. Without it each
  sidecar creates its own.
* the task: ``SIDECAR_TASK`` from the downward API, ``metadata.annotations
  ['effect-sidecar.io/task']`` when the pod template has that annotation, else
  ``metadata.labels['job-name']`` for a Job's or CronJob's pods (one task per Job run; a
  retried pod of the same Job resumes it), else ``metadata.name`` (stable for StatefulSet
  pods; a Deployment's pods should carry the annotation). An Indexed Job's pods run one
  completion index each, so each gets a task of its own: ``SIDECAR_TASK`` is
  ``$(EFFECT_SIDECAR_TASK_BASE)-$(JOB_COMPLETION_INDEX)``, the task as above and the
  index from ``metadata.annotations['batch.kubernetes.io/job-completion-index']``, which
  kubelet joins (``$(VAR)`` expansion of earlier variables): the index is set only when
  the controller makes each pod, so a Job's template (``completionMode: Indexed``) gets the
  same variables as a pod carrying the index (the webhook's case). A Job of several pods
  without indexes (``parallelism`` or ``completions`` above 1) gets
  :data:`PARALLEL_JOB_WARNING`: its pods share one task and one lease.
  ``SIDECAR_WORKER`` is the pod name, ``SIDECAR_STORE`` comes from the store Secret;
  ``sidecar serve`` reads ``SIDECAR_*`` itself, so no ``$(VAR)`` expansion is needed in
  its command.
* ``effect-sidecar.io/status``: JSON of the version and what was added.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sidecar
from sidecar.agent.trust import TRUST_VARIABLES
from sidecar.errors import InvalidInjection
from sidecar.kube import annotations as notes
from sidecar.kube import shape
from sidecar.kube.config import InjectConfig
from sidecar.kube.containers import (
    BUNDLE,
    DATA_DIR,
    REDIRECT,
    SIDECAR,
    TOKEN_DIR,
    TOKEN_VOLUME,
    TRUST_DIR,
    TRUST_VOLUME,
    WAIT_READY,
    add_env,
    add_mount,
    app_env,
    pod_volumes,
    redirect_container,
    sidecar_container,
    volume_names,
)

_TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Pod": (),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
#: Where a Job's spec is (completionMode, parallelism, completions).
_JOB_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "Job": ("spec",),
    "CronJob": ("spec", "jobTemplate", "spec"),
}
_JOB_LABELS = ("job-name", "batch.kubernetes.io/job-name")
#: Set by the Job controller on an Indexed Job's pods: an annotation since 1.21, also a
#: label since 1.28; the annotation is read, being there on every version.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
#: Warnings are shown by the webhook (AdmissionReview warnings, which the API server
#: passes to kubectl) and by ``sidecar inject`` (stderr); the API server may cut a
#: warning over 256 characters, so each stays under that.
JOB_END_WARNING = (
    "effect-sidecar: the sidecar is a regular container (native-sidecar: false), so this "
    "Job's pod ends only once it stops: end the agent's command with an authorized POST to "
    "http://127.0.0.1:7300/v1/shutdown (deploy/README.md)"
)
PARALLEL_JOB_WARNING = (
    "effect-sidecar: this Job runs several pods (parallelism or completions > 1) without "
    "completion indexes, so they share one task and one lease: one is ready at a time and "
    "each replays what those before it did; use completionMode: Indexed"
)
HOST_NETWORK_WARNING = (
    "effect-sidecar: hostNetwork pod admitted WITHOUT the sidecar "
    f'({notes.ALLOW_HOST_NETWORK}: "true"): its side effects are not recorded and may '
    "repeat when it is retried"
)
HOST_NETWORK_REFUSAL = (
    "hostNetwork: true puts the pod in the node's network namespace: the sidecar's iptables "
    "redirect would capture the whole node's traffic (and its ports would be the node's), "
    "so the sidecar cannot protect this agent and is not injected; to admit the pod "
    f'unprotected anyway, set the annotation {notes.ALLOW_HOST_NETWORK}: "true"'
)


def kept_trust_warning(container: str, variable: str) -> str:
    """The warning for a CA variable an app container sets itself (under 256 characters:
    a container name has at most 63)."""
    return (
        f"effect-sidecar: container {container!r} sets {variable} itself (kept): its TLS "
        f"through the sidecar fails unless that bundle has the sidecar's CA ({BUNDLE})"
    )


@dataclass(frozen=True, slots=True)
class Outcome:
    manifest: dict[str, Any]
    injected: bool
    reason: str  # why not, or "injected"
    warnings: tuple[str, ...] = ()


def is_workload(manifest: Mapping[str, Any]) -> bool:
    """A kind with a pod template, and a spec to find it in."""
    kind = manifest.get("kind")
    return isinstance(kind, str) and kind in _TEMPLATE_PATHS and manifest.get("spec") is not None


def _dig(manifest: dict[str, Any], path: tuple[str, ...], what: str) -> dict[str, Any]:
    """The object at ``path``, refused naming the first step that is not an object."""
    node = manifest
    for depth, key in enumerate(path, start=1):
        child = node.get(key)
        if not isinstance(child, dict):
            where = ".".join(path[:depth])
            label = what if depth == len(path) else "an object"
            raise InvalidInjection(f"{where}: expected {label}, got {shape.describe(child)}")
        node = child
    return node


def _template(manifest: dict[str, Any]) -> dict[str, Any]:
    return _dig(manifest, _TEMPLATE_PATHS[manifest["kind"]], "an object (the pod template)")


def _job_spec(manifest: dict[str, Any]) -> dict[str, Any] | None:
    """A Job's or CronJob's Job spec, checked; None for other kinds."""
    path = _JOB_SPEC_PATHS.get(manifest["kind"])
    if path is None:
        return None
    spec = _dig(manifest, path, "an object (the Job spec)")
    shape.check_job_spec(spec, ".".join(path))
    return spec


def _where(kind: str) -> str:
    """The pod template's path in a manifest of ``kind``, as a prefix for messages."""
    path = _TEMPLATE_PATHS[kind]
    return ".".join(path) + "." if path else ""


def inject(manifest: Mapping[str, Any], namespace: str, config: InjectConfig) -> Outcome:
    """The manifest with the sidecar injected, or unchanged with the reason; with the
    warnings to show either way."""
    shape.check_depth(manifest)  # before anything recursive copies it
    result = copy.deepcopy(dict(manifest))
    if not is_workload(result):
        return Outcome(result, injected=False, reason="not a workload")
    kind: str = result["kind"]
    pod = _template(result)
    unchanged = copy.deepcopy(dict(manifest))
    # The namespace first: a system pod is never refused, whatever its annotations say.
    if config.skips(namespace):
        return Outcome(unchanged, injected=False, reason=f"namespace {namespace} is skipped")
    where = _where(kind)
    metadata = shape.check_metadata(pod.get("metadata"), f"{where}metadata", notes.PREFIX)
    pod["metadata"] = metadata
    if not notes.opted_in(metadata):
        return Outcome(unchanged, injected=False, reason="not opted in")
    if notes.STATUS in (metadata.get("annotations") or {}):
        return Outcome(unchanged, injected=False, reason="already injected")
    spec = shape.check_pod_spec(pod.get("spec"), f"{where}spec")
    job_spec = _job_spec(result)
    request = notes.read(metadata, config)
    if spec.get("hostNetwork"):
        return _host_network(unchanged, request)
    return _injected(result, metadata, spec, job_spec, request, config)


def _injected(
    result: dict[str, Any],
    metadata: dict[str, Any],
    spec: dict[str, Any],
    job_spec: Mapping[str, Any] | None,
    request: notes.Request,
    config: InjectConfig,
) -> Outcome:
    """``result`` with the sidecar in its pod template (``metadata`` and ``spec``)."""
    job = job_spec is not None or _is_job(metadata)
    index_field = _index_source(metadata, job_spec)
    status, warnings = _inject_spec(spec, metadata, request, config, job=job, index=index_field)
    annotations = metadata.setdefault("annotations", {}) or {}
    metadata["annotations"] = annotations
    annotations[notes.STATUS] = json.dumps(status, sort_keys=True, separators=(",", ":"))
    if job and not request.native_sidecar:
        warnings.insert(0, JOB_END_WARNING)
    if job_spec is not None and _shares_one_task(job_spec):
        warnings.insert(0, PARALLEL_JOB_WARNING)
    return Outcome(result, injected=True, reason="injected", warnings=tuple(warnings))


def _host_network(unchanged: dict[str, Any], request: notes.Request) -> Outcome:
    """A hostNetwork pod that opted in: refused, or admitted unprotected if it says so."""
    # The pod's network namespace is the node's: the redirect's iptables rules would
    # capture every process of the node, and the sidecar's ports would be the node's.
    if not request.allow_host_network:
        raise InvalidInjection(HOST_NETWORK_REFUSAL, annotation=notes.ALLOW_HOST_NETWORK)
    return Outcome(
        unchanged,
        injected=False,
        reason="hostNetwork pod admitted unprotected",
        warnings=(HOST_NETWORK_WARNING,),
    )


def _is_job(metadata: Mapping[str, Any]) -> bool:
    """A pod a Job created (what the webhook sees)."""
    labels = metadata.get("labels") or {}
    owners = metadata.get("ownerReferences") or []
    return any(label in labels for label in _JOB_LABELS) or any(
        isinstance(owner, dict) and owner.get("kind") == "Job" for owner in owners
    )


def _shares_one_task(job_spec: Mapping[str, Any]) -> bool:
    """A Job whose several pods, having no completion index, all get the one task."""
    if job_spec.get("completionMode") == "Indexed":
        return False
    return (job_spec.get("parallelism") or 1) > 1 or (job_spec.get("completions") or 1) > 1


def _index_source(metadata: Mapping[str, Any], job_spec: Mapping[str, Any] | None) -> str | None:
    """The downward-API path of the pod's completion index, if it has one: for an Indexed
    Job's template (the index is known only once the controller makes each pod), or for a
    pod such a Job made (the webhook's case; the index is already set)."""
    annotation = f"metadata.annotations['{COMPLETION_INDEX}']"
    if job_spec is not None:
        return annotation if job_spec.get("completionMode") == "Indexed" else None
    if COMPLETION_INDEX in (metadata.get("annotations") or {}):
        return annotation
    if COMPLETION_INDEX in (metadata.get("labels") or {}):
        return f"metadata.labels['{COMPLETION_INDEX}']"
    return None


def _check_free(spec: Mapping[str, Any], volumes: list[str], uid: int | None) -> None:
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            if container.get("name") in {SIDECAR, REDIRECT}:
                raise InvalidInjection(
                    f"the pod already has a container named {container['name']!r} but no "
                    f"{notes.STATUS} annotation: remove it, or mark the pod as injected",
                    annotation=notes.STATUS,
                )
            for mount in container.get("volumeMounts") or []:
                if mount.get("mountPath", "").rstrip("/") in {DATA_DIR, TRUST_DIR}:
                    raise InvalidInjection(
                        f"container {container.get('name')!r} already mounts something at "
                        f"{mount['mountPath']}, which the sidecar's volumes use"
                    )
    pod_user = (spec.get("securityContext") or {}).get("runAsUser")
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        user = (container.get("securityContext") or {}).get("runAsUser", pod_user)
        if uid is not None and user == uid:
            # The redirect exempts the sidecar's UID: an agent running as it is not seen.
            raise InvalidInjection(
                f"container {container.get('name')!r} runs as UID {uid}, the sidecar's own: "
                "its traffic would bypass the sidecar; run it as another user"
            )
    taken = {volume.get("name") for volume in spec.get("volumes") or []}
    for name in volumes:
        if name in taken:
            raise InvalidInjection(f"the pod already has a volume named {name!r}")


def _task_source(metadata: Mapping[str, Any], annotated: bool, job: bool) -> str:
    if annotated:
        return f"metadata.annotations['{notes.TASK}']"
    if job:
        labels = metadata.get("labels") or {}
        # The Job controller sets both labels (the prefixed one since 1.27); a pod that
        # carries only the prefixed one must not get an empty task from the legacy one.
        if "job-name" not in labels and "batch.kubernetes.io/job-name" in labels:
            return "metadata.labels['batch.kubernetes.io/job-name']"
        return "metadata.labels['job-name']"
    return "metadata.name"


def _kept_trust(containers: list[dict[str, Any]]) -> list[str]:
    """A warning for each CA variable an app container sets to something other than the
    sidecar's bundle: it is kept, so that client will not trust the sidecar's CA."""
    return [
        kept_trust_warning(container["name"], item["name"])
        for container in containers
        for item in container.get("env") or []
        if item["name"] in TRUST_VARIABLES and item.get("value") != BUNDLE
    ]


def _inject_spec(
    spec: dict[str, Any],
    metadata: Mapping[str, Any],
    request: notes.Request,
    config: InjectConfig,
    *,
    job: bool,
    index: str | None,
) -> tuple[dict[str, Any], list[str]]:
    """Inject into ``spec``; return the status annotation's content and the warnings."""
    volumes = volume_names(request, config)
    transparent = request.mode == "transparent"
    _check_free(spec, volumes, config.run_as_user if transparent else None)
    task_field = _task_source(metadata, request.task_annotated, job)
    added = sidecar_container(request, config, task_field, index)
    app_inits = list(spec.get("initContainers") or [])
    apps = list(spec.get("containers") or [])
    kept: dict[str, list[str]] = {}
    touched = apps + (app_inits if request.native_sidecar else [])
    warnings = _kept_trust(touched)
    for container in touched:
        names = add_env(container, app_env(transparent))
        if names:
            kept[container["name"]] = names
        add_mount(container, {"name": TRUST_VOLUME, "mountPath": TRUST_DIR, "readOnly": True})
        if job and not request.native_sidecar:
            # The agent's command ends the pod with POST /v1/shutdown, which needs the token.
            add_mount(container, {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True})
    redirect = [redirect_container(request, config)] if transparent else []
    if request.native_sidecar:
        added["restartPolicy"] = "Always"
        spec["initContainers"] = [*redirect, added, *app_inits]
        spec["containers"] = apps
    else:
        added["lifecycle"] = {"postStart": {"exec": {"command": ["python", "-c", WAIT_READY]}}}
        if app_inits or redirect:
            spec["initContainers"] = [*app_inits, *redirect]
        spec["containers"] = [added, *apps]
    spec["volumes"] = [*(spec.get("volumes") or []), *pod_volumes(request, config)]
    status: dict[str, Any] = {
        "version": sidecar.__version__,
        "mode": request.mode,
        "nativeSidecar": request.native_sidecar,
        "initContainers": ([REDIRECT] if transparent else [])
        + ([SIDECAR] if request.native_sidecar else []),
        "containers": [] if request.native_sidecar else [SIDECAR],
        "volumes": volumes,
        "task": task_field,
    }
    if index is not None:
        status["taskIndex"] = index
    if kept:
        status["keptEnv"] = kept
    return status, warnings
