"""A pod's ``effect-sidecar.io/*`` labels and annotations, read and validated in one place.

Every bad value is an :class:`InvalidInjection` naming the annotation and the value, raised
before anything is changed, so a pod is injected whole or not at all.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sidecar.errors import InvalidInjection
from sidecar.kube.config import InjectConfig, Mode

PREFIX = "effect-sidecar.io/"
INJECT = PREFIX + "inject"
STATUS = PREFIX + "status"
MODE = PREFIX + "mode"
NATIVE_SIDECAR = PREFIX + "native-sidecar"
TASK = PREFIX + "task"
PG_UPSTREAM = PREFIX + "pg-upstream"
PG_PORTS = PREFIX + "pg-ports"
INCLUDE_CIDRS = PREFIX + "include-outbound-cidrs"
EXCLUDE_CIDRS = PREFIX + "exclude-outbound-cidrs"
INCLUDE_PORTS = PREFIX + "include-outbound-ports"
EXCLUDE_PORTS = PREFIX + "exclude-outbound-ports"
RULES_CONFIGMAP = PREFIX + "rules-configmap"
#: "true": admit a ``hostNetwork`` pod that opted in, without the sidecar (it cannot
#: protect such a pod); otherwise such a pod is refused.
ALLOW_HOST_NETWORK = PREFIX + "allow-host-network"

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_BOOLEANS = {"true": True, "false": False}


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod asks for, validated."""

    mode: Mode
    native_sidecar: bool
    task_annotated: bool
    pg_upstream: str | None
    pg_ports: tuple[int, ...]
    include_cidrs: tuple[str, ...]
    exclude_cidrs: tuple[str, ...]
    include_ports: tuple[str, ...]
    exclude_ports: tuple[str, ...]
    rules_configmap: str | None
    allow_host_network: bool = False


def _boolean(name: str, value: str) -> bool:
    try:
        return _BOOLEANS[value.strip().lower()]
    except KeyError:
        raise InvalidInjection(
            f'{name}: expected "true" or "false", got {value!r}', annotation=name
        ) from None


def opted_in(metadata: Mapping[str, Any]) -> bool:
    """``effect-sidecar.io/inject: "true"`` as an annotation or, failing that, a label."""
    annotations = metadata.get("annotations") or {}
    labels = metadata.get("labels") or {}
    value = annotations.get(INJECT, labels.get(INJECT))
    return value is not None and _boolean(INJECT, str(value))


def _items(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def _cidrs(name: str, value: str | None) -> tuple[str, ...]:
    if value is None:
        return ()
    cidrs: list[str] = []
    for item in _items(value):
        try:
            cidrs.append(str(ipaddress.ip_network(item, strict=True)))
        except ValueError as exc:
            raise InvalidInjection(
                f"{name}: {item!r} is not a CIDR (e.g. 10.0.0.0/8): {exc}", annotation=name
            ) from None
    if not cidrs:
        raise InvalidInjection(f"{name}: no CIDR in {value!r}", annotation=name)
    return tuple(cidrs)


def _ports(name: str, value: str | None, *, wildcard: bool = False) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _items(value)
    if wildcard and items == ["*"]:
        return ("*",)
    for item in items:
        if not item.isdigit() or not 1 <= int(item) <= 65535:
            raise InvalidInjection(f"{name}: {item!r} is not a port (1-65535)", annotation=name)
    if not items:
        raise InvalidInjection(f"{name}: no port in {value!r}", annotation=name)
    return tuple(str(int(item)) for item in items)


def _pg_upstream(value: str | None) -> str | None:
    if value is None:
        return None
    parts = urlsplit(value.strip())
    if parts.scheme not in {"postgresql", "postgres"} or not parts.hostname:
        raise InvalidInjection(
            f"{PG_UPSTREAM}: expected postgresql://HOST:PORT[?sslmode=...], got {value!r}",
            annotation=PG_UPSTREAM,
        )
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise InvalidInjection(
            f"{PG_UPSTREAM}: bad port in {value!r}", annotation=PG_UPSTREAM
        ) from None
    return value.strip()


def _name(name: str, value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) > 253 or not _DNS1123.match(value):
        raise InvalidInjection(f"{name}: {value!r} is not a valid object name", annotation=name)
    return value


def read(metadata: Mapping[str, Any], config: InjectConfig) -> Request:
    """Validate every ``effect-sidecar.io/*`` annotation of a pod (template)."""
    # Unquoted YAML (pg-ports: 5432) is not valid Kubernetes, but its meaning is clear.
    annotations = {str(k): str(v) for k, v in (metadata.get("annotations") or {}).items()}
    mode = annotations.get(MODE, config.mode)
    if mode not in {"transparent", "env-proxy"}:
        raise InvalidInjection(
            f'{MODE}: expected "transparent" or "env-proxy", got {mode!r}', annotation=MODE
        )
    native = config.native_sidecar
    if NATIVE_SIDECAR in annotations:
        native = _boolean(NATIVE_SIDECAR, annotations[NATIVE_SIDECAR])
    allow_host_network = _boolean(ALLOW_HOST_NETWORK, annotations.get(ALLOW_HOST_NETWORK, "false"))
    task = annotations.get(TASK)
    if task is not None and not task.strip():
        raise InvalidInjection(f"{TASK}: the task id is empty", annotation=TASK)
    pg_ports = tuple(int(port) for port in _ports(PG_PORTS, annotations.get(PG_PORTS)))
    if pg_ports and PG_UPSTREAM not in annotations:
        raise InvalidInjection(
            f"{PG_PORTS}: set, but {PG_UPSTREAM} is not: without an upstream the sidecar "
            "runs no PostgreSQL relay to redirect those ports to",
            annotation=PG_PORTS,
        )
    return Request(
        mode="env-proxy" if mode == "env-proxy" else "transparent",
        native_sidecar=native,
        task_annotated=task is not None,
        pg_upstream=_pg_upstream(annotations.get(PG_UPSTREAM)),
        pg_ports=pg_ports,
        include_cidrs=_cidrs(INCLUDE_CIDRS, annotations.get(INCLUDE_CIDRS)),
        exclude_cidrs=_cidrs(EXCLUDE_CIDRS, annotations.get(EXCLUDE_CIDRS)),
        include_ports=_ports(INCLUDE_PORTS, annotations.get(INCLUDE_PORTS), wildcard=True),
        exclude_ports=_ports(EXCLUDE_PORTS, annotations.get(EXCLUDE_PORTS)),
        rules_configmap=_name(
            RULES_CONFIGMAP, annotations.get(RULES_CONFIGMAP, config.rules_configmap)
        ),
        allow_host_network=allow_host_network,
    )
