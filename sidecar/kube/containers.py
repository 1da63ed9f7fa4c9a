"""What an injected pod gets: the sidecar and redirect containers, their volumes and the
variables added to the app containers; built from a validated request and the config.
:mod:`sidecar.kube.inject` decides where they go.
"""

from __future__ import annotations

import copy
from typing import Any

from sidecar.agent.trust import PG_CHANNEL_BINDING, TRUST_VARIABLES
from sidecar.kube import annotations as notes
from sidecar.kube.config import InjectConfig

SIDECAR = "effect-sidecar"
REDIRECT = "effect-sidecar-redirect"
DATA_VOLUME = "effect-sidecar-data"
TRUST_VOLUME = "effect-sidecar-trust"
TOKEN_VOLUME = "effect-sidecar-control-token"  # noqa: S105 - a volume name
RULES_VOLUME = "effect-sidecar-rules"
CA_VOLUME = "effect-sidecar-ca"
DATA_DIR = "/var/run/effect-sidecar"
#: The trust bundle's own volume: app containers mount this one, never DATA_DIR, where
#: the CA private key and (with the default store) the effect log live.
TRUST_DIR = "/var/run/effect-sidecar-trust"
TOKEN_DIR = "/etc/effect-sidecar/control"  # noqa: S105 - a mount path
RULES_DIR = "/etc/effect-sidecar/rules"
CA_DIR = "/etc/effect-sidecar/ca"
BUNDLE = f"{TRUST_DIR}/ca-bundle.pem"
CONTROL_PORT = 7300
PROXY_PORT = 7301
PG_PORT = 7302
PROXY_URL = f"http://127.0.0.1:{PROXY_PORT}"
NO_PROXY = "127.0.0.1,localhost,::1"
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
NO_PROXY_VARIABLES = ("NO_PROXY", "no_proxy")
#: An Indexed Job's pod: its task, then its completion index (the variable the Job
#: controller gives every container, defined here too so it comes before SIDECAR_TASK,
#: which kubelet composes from both with $(VAR) expansion).
TASK_BASE = "EFFECT_SIDECAR_TASK_BASE"
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
#: Waits for readiness in a postStart hook (fallback shape): the image has Python.
WAIT_READY = (
    "import time, urllib.request\n"
    "for _ in range(1200):\n"
    "    try:\n"
    f"        urllib.request.urlopen('http://127.0.0.1:{CONTROL_PORT}/readyz', timeout=1)\n"
    "        break\n"
    "    except Exception:\n"
    "        time.sleep(0.25)\n"
    "else:\n"
    "    raise SystemExit('effect-sidecar did not become ready')\n"
)


def app_env(transparent: bool) -> list[dict[str, Any]]:
    env = [{"name": name, "value": BUNDLE} for name in TRUST_VARIABLES]
    env.append({"name": PG_CHANNEL_BINDING[0], "value": PG_CHANNEL_BINDING[1]})
    if not transparent:
        env += [{"name": name, "value": PROXY_URL} for name in PROXY_VARIABLES]
        env += [{"name": name, "value": NO_PROXY} for name in NO_PROXY_VARIABLES]
    return env


def add_env(container: dict[str, Any], env: list[dict[str, Any]]) -> list[str]:
    """Append what the container does not set itself; return the names it kept."""
    own = list(container.get("env") or [])  # ``env: null`` is a container with none
    present = {item.get("name") for item in own}
    kept = [item["name"] for item in env if item["name"] in present]
    own.extend(item for item in env if item["name"] not in present)
    container["env"] = own
    return kept


def add_mount(container: dict[str, Any], mount: dict[str, Any]) -> None:
    container["volumeMounts"] = [*(container.get("volumeMounts") or []), mount]


def _security(config: InjectConfig) -> dict[str, Any]:
    return {
        "runAsUser": config.run_as_user,
        "runAsGroup": config.run_as_user,
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _field(path: str) -> dict[str, Any]:
    return {"valueFrom": {"fieldRef": {"fieldPath": path}}}


def task_env(task_field: str, index_field: str | None) -> list[dict[str, Any]]:
    """``SIDECAR_TASK`` from the downward API; with ``index_field`` (an Indexed Job's
    pod) the task and the completion index joined by ``-``, one task per index."""
    if index_field is None:
        return [{"name": "SIDECAR_TASK", **_field(task_field)}]
    return [
        {"name": TASK_BASE, **_field(task_field)},
        {"name": COMPLETION_INDEX, **_field(index_field)},
        {"name": "SIDECAR_TASK", "value": f"$({TASK_BASE})-$({COMPLETION_INDEX})"},
    ]


def sidecar_container(
    request: notes.Request, config: InjectConfig, task_field: str, index_field: str | None
) -> dict[str, Any]:
    command = [
        "sidecar",
        "serve",
        "--mode",
        "transparent" if request.mode == "transparent" else "regular",
        "--data-dir",
        DATA_DIR,
        "--ca-bundle",
        BUNDLE,
        "--control-listen",
        f"0.0.0.0:{CONTROL_PORT}",  # kubelet probes come from outside the pod
        "--control-token-file",
        f"{TOKEN_DIR}/token",
        "--proxy-listen",
        f"127.0.0.1:{PROXY_PORT}",
        "--pg-listen",
        f"127.0.0.1:{PG_PORT}",
    ]
    if request.pg_upstream:
        command += ["--pg-upstream", request.pg_upstream]
    if request.rules_configmap:
        command += ["--rules", RULES_DIR]
    if config.ca_secret:
        command += ["--ca-from", CA_DIR]
    env: list[dict[str, Any]] = [
        *task_env(task_field, index_field),
        {"name": "SIDECAR_WORKER", **_field("metadata.name")},
    ]
    if config.store_secret is not None:
        env.append(
            {
                "name": "SIDECAR_STORE",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": config.store_secret.name,
                        "key": config.store_secret.key,
                    }
                },
            }
        )
        if config.store_password_key:
            # libpq's variable (psycopg reads it): the password stays out of the URL.
            env.append(
                {
                    "name": "PGPASSWORD",
                    "valueFrom": {
                        "secretKeyRef": {
                            "name": config.store_secret.name,
                            "key": config.store_password_key,
                            "optional": True,
                        }
                    },
                }
            )
    mounts = [
        {"name": DATA_VOLUME, "mountPath": DATA_DIR},
        {"name": TRUST_VOLUME, "mountPath": TRUST_DIR},
        {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
    ]
    if request.rules_configmap:
        mounts.append({"name": RULES_VOLUME, "mountPath": RULES_DIR, "readOnly": True})
    if config.ca_secret:
        mounts.append({"name": CA_VOLUME, "mountPath": CA_DIR, "readOnly": True})

    def probe(path: str, **extra: int) -> dict[str, Any]:
        return {"httpGet": {"path": path, "port": CONTROL_PORT}, "periodSeconds": 1, **extra}

    container: dict[str, Any] = {
        "name": SIDECAR,
        "image": config.image,
        "command": command,
        "env": env,
        "ports": [{"name": "es-control", "containerPort": CONTROL_PORT, "protocol": "TCP"}],
        "startupProbe": probe("/readyz", failureThreshold=300),
        "readinessProbe": probe("/readyz", periodSeconds=5),
        "livenessProbe": probe("/healthz", periodSeconds=10, failureThreshold=3),
        "securityContext": _security(config),
        "resources": copy.deepcopy(config.resources),
        "volumeMounts": mounts,
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    return container


def redirect_container(request: notes.Request, config: InjectConfig) -> dict[str, Any]:
    command = [
        "sidecar",
        "redirect",
        "--proxy-port",
        str(PROXY_PORT),
        "--pg-port",
        str(PG_PORT),
        "--owner-uid",
        str(config.run_as_user),
    ]
    if not request.pg_upstream:
        # No relay listens without an upstream: PostgreSQL traffic must go out as it is.
        command += ["--pg-ports", ""]
    optional: list[tuple[str, tuple[Any, ...]]] = [
        ("--pg-ports", request.pg_ports),
        ("--include-cidrs", request.include_cidrs),
        ("--exclude-cidrs", request.exclude_cidrs),
        ("--include-ports", request.include_ports),
        ("--exclude-ports", request.exclude_ports),
    ]
    for flag, values in optional:
        if values:
            command += [flag, ",".join(str(value) for value in values)]
    container: dict[str, Any] = {
        "name": REDIRECT,
        "image": config.image,
        "command": command,
        "securityContext": {
            "runAsUser": 0,
            "runAsNonRoot": False,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]},
        },
        "resources": copy.deepcopy(config.redirect_resources),
    }
    if config.image_pull_policy:
        container["imagePullPolicy"] = config.image_pull_policy
    return container


def pod_volumes(request: notes.Request, config: InjectConfig) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": DATA_VOLUME, "emptyDir": {}},
        # The bundle is ~250 KB of system roots plus the CA; the limit keeps an app that
        # could write here (it cannot: read-only mount) from filling the node's disk.
        {"name": TRUST_VOLUME, "emptyDir": {"sizeLimit": "8Mi"}},
        {
            "name": TOKEN_VOLUME,
            "secret": {
                "secretName": config.control_token_secret.name,
                "items": [{"key": config.control_token_secret.key, "path": "token"}],
                # Owned by root; readable so UID 1337 can read it. Only the sidecar mounts it.
                "defaultMode": 0o444,
            },
        },
    ]
    if request.rules_configmap:
        volumes.append({"name": RULES_VOLUME, "configMap": {"name": request.rules_configmap}})
    if config.ca_secret:
        volumes.append(
            {
                "name": CA_VOLUME,
                "secret": {
                    "secretName": config.ca_secret,
                    "items": [
                        {"key": "tls.crt", "path": "tls.crt"},
                        {"key": "tls.key", "path": "tls.key"},
                    ],
                    # Secret files are owned by root: 0400 would keep UID 1337 out (without
                    # an fsGroup). Only the sidecar container mounts this volume.
                    "defaultMode": 0o444,
                },
            }
        )
    return volumes


def volume_names(request: notes.Request, config: InjectConfig) -> list[str]:
    """The names of :func:`pod_volumes`, in order (the status annotation lists them)."""
    return [volume["name"] for volume in pod_volumes(request, config)]
