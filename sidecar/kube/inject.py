"""Injecting the sidecar into a Pod or a workload's pod template (pure: no I/O).

:func:`inject` takes a manifest (Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, Job,
CronJob), its namespace and an :class:`InjectConfig`, and returns a new manifest; the
input is never modified. Pods opt in with ``effect-sidecar.io/inject: "true"`` (label or
annotation on the pod template). Not injected, returned as they came: pods that do not
opt in, pods already carrying ``effect-sidecar.io/status`` (so a second injection, or a
webhook reinvoked with ``reinvocationPolicy: IfNeeded``, changes nothing), ``hostNetwork``
pods (iptables there would redirect the node's traffic), and pods in ``kube-system``,
``kube-public``, ``kube-node-lease`` and the injector's own namespace (checked first, so
a system pod is never refused). Refused with :class:`InvalidInjection`, nothing changed: a
bad ``effect-sidecar.io/*`` value, a container already named ``effect-sidecar`` or
``effect-sidecar-redirect`` (without the status annotation), a volume name or a mount at
``/var/run/effect-sidecar`` already taken, and in transparent mode an app running as the
sidecar's UID (the redirect exempts that UID, so the app would bypass the sidecar).

What an injected pod gets:

* ``effect-sidecar``, the sidecar, running ``sidecar serve`` as UID 1337 with no
  capabilities and a read-only root filesystem. Native sidecar (default; Kubernetes
  1.29+): an ``initContainers`` entry with ``restartPolicy: Always`` whose startupProbe
  (``GET /readyz`` on 7300) holds back the later init containers and the app until the
  sidecar is ready; kubelet stops it after the app containers end, so a Job completes.
  ``/readyz`` answers 200 only once the CA bundle is written, the proxy's gate is open,
  the PostgreSQL relay listens, the task's lease is held (a new pod waits out the lease
  of the one it replaces) and the store took a durable test write
  (:mod:`sidecar.readiness`). Fallback (``effect-sidecar.io/native-sidecar: "false"`` or
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
  ``GIT_SSL_CAINFO``, ``PIP_CERT``, ``AWS_CA_BUNDLE`` pointing at it. A variable the
  container already sets is **kept** (the operator's explicit value wins; the status
  annotation lists what was kept). The sidecar's data volume (the CA key, the SQLite
  store) is mounted in the sidecar alone: not even a root app can read the key.
* a shared CA (``ca_secret``: a TLS Secret's name): the Secret mounted read-only at
  ``/etc/effect-sidecar/ca`` (``tls.crt``, ``tls.key``) in the sidecar container alone,
  and ``--ca-from`` that directory; ``sidecar serve`` copies the CA into the data volume's
  ``ca/``, so every pod of the namespace intercepts with the same CA. Without it each
  sidecar creates its own.
* the task: ``SIDECAR_TASK`` from the downward API, ``metadata.annotations
  ['effect-sidecar.io/task']`` when the pod template has that annotation, else
  ``metadata.labels['job-name']`` for a Job's or CronJob's pods (one task per Job run; a
  retried pod of the same Job resumes it), else ``metadata.name`` (stable for StatefulSet
  pods; a Deployment's pods should carry the annotation). ``SIDECAR_WORKER`` is the pod
  name, ``SIDECAR_STORE`` comes from the store Secret; ``sidecar serve`` reads
  ``SIDECAR_*`` itself, so no ``$(VAR)`` expansion is needed in its command.
* ``effect-sidecar.io/status``: JSON of the version and what was added.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sidecar
from sidecar.errors import InvalidInjection
from sidecar.kube import annotations as notes
from sidecar.kube.config import InjectConfig
from sidecar.kube.containers import (
    DATA_DIR,
    REDIRECT,
    SIDECAR,
    TRUST_DIR,
    TRUST_VOLUME,
    WAIT_READY,
    add_env,
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
_JOB_KINDS = frozenset({"Job", "CronJob"})
_JOB_LABELS = ("job-name", "batch.kubernetes.io/job-name")
#: Shown by the webhook (AdmissionReview warnings, which the API server passes to kubectl)
#: and by ``sidecar inject``; the API server may cut warnings over 256 characters.
JOB_END_WARNING = (
    "effect-sidecar: the sidecar is a regular container (native-sidecar: false), so this "
    "Job's pod ends only once it stops: finish the agent's command with a POST to "
    "http://127.0.0.1:7300/v1/shutdown (deploy/README.md)"
)


@dataclass(frozen=True, slots=True)
class Outcome:
    manifest: dict[str, Any]
    injected: bool
    reason: str  # why not, or "injected"
    warnings: tuple[str, ...] = ()


def is_workload(manifest: Mapping[str, Any]) -> bool:
    return manifest.get("kind") in _TEMPLATE_PATHS and isinstance(manifest.get("spec"), dict)


def _template(manifest: dict[str, Any]) -> dict[str, Any]:
    node = manifest
    path = _TEMPLATE_PATHS[manifest["kind"]]
    for key in path:
        child = node.get(key)
        if not isinstance(child, dict):
            raise InvalidInjection(f"{manifest['kind']} has no pod template at {'.'.join(path)}")
        node = child
    return node


def inject(manifest: Mapping[str, Any], namespace: str, config: InjectConfig) -> Outcome:
    """The manifest with the sidecar injected, or unchanged with the reason."""
    result = copy.deepcopy(dict(manifest))
    if not is_workload(result):
        return Outcome(result, injected=False, reason="not a workload")
    pod = _template(result)
    metadata: dict[str, Any] = pod.setdefault("metadata", {}) or {}
    pod["metadata"] = metadata
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise InvalidInjection(f"{result['kind']}: the pod template has no spec")
    unchanged = copy.deepcopy(dict(manifest))
    # The namespace first: a system pod is never refused, whatever its annotations say.
    if config.skips(namespace):
        return Outcome(unchanged, injected=False, reason=f"namespace {namespace} is skipped")
    if not notes.opted_in(metadata):
        return Outcome(unchanged, injected=False, reason="not opted in")
    if notes.STATUS in (metadata.get("annotations") or {}):
        return Outcome(unchanged, injected=False, reason="already injected")
    if spec.get("hostNetwork"):
        return Outcome(unchanged, injected=False, reason="hostNetwork pod")
    request = notes.read(metadata, config)
    job = _is_job(result["kind"], metadata)
    status = _inject_spec(spec, metadata, request, config, job=job)
    annotations = metadata.setdefault("annotations", {}) or {}
    metadata["annotations"] = annotations
    annotations[notes.STATUS] = json.dumps(status, sort_keys=True, separators=(",", ":"))
    warnings = (JOB_END_WARNING,) if job and not request.native_sidecar else ()
    return Outcome(result, injected=True, reason="injected", warnings=warnings)


def _is_job(kind: str, metadata: Mapping[str, Any]) -> bool:
    """A Job's or CronJob's template, or a pod a Job created (what the webhook sees)."""
    if kind in _JOB_KINDS:
        return True
    labels = metadata.get("labels") or {}
    owners = metadata.get("ownerReferences") or []
    return any(label in labels for label in _JOB_LABELS) or any(
        isinstance(owner, dict) and owner.get("kind") == "Job" for owner in owners
    )


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


def _inject_spec(
    spec: dict[str, Any],
    metadata: Mapping[str, Any],
    request: notes.Request,
    config: InjectConfig,
    *,
    job: bool,
) -> dict[str, Any]:
    volumes = volume_names(request, config)
    transparent = request.mode == "transparent"
    _check_free(spec, volumes, config.run_as_user if transparent else None)
    task_field = _task_source(metadata, request.task_annotated, job)
    added = sidecar_container(request, config, task_field)
    app_inits = list(spec.get("initContainers") or [])
    apps = list(spec.get("containers") or [])
    kept: dict[str, list[str]] = {}
    touched = apps + (app_inits if request.native_sidecar else [])
    for container in touched:
        names = add_env(container, app_env(transparent))
        if names:
            kept[container["name"]] = names
        container.setdefault("volumeMounts", []).append(
            {"name": TRUST_VOLUME, "mountPath": TRUST_DIR, "readOnly": True}
        )
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
    if kept:
        status["keptEnv"] = kept
    return status
