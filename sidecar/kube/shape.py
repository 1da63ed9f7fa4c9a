"""The shape of what injection reads from a manifest, checked before it is read.

A manifest comes from a file (``sidecar inject``) or from whoever called the webhook, so
a field may hold anything: a container that is ``null``, ``env`` given as a string,
``labels`` as a list, a document nested thousands of levels deep. Each of those is an
:class:`InvalidInjection` naming the field's path (``spec.template.spec.containers[1]``)
and what it holds, raised before anything is copied or changed, instead of a crash.
Only the fields injection reads are checked; the API server validates the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sidecar.errors import InvalidInjection

#: Deeper than any Kubernetes object (a pod with affinity terms and managedFields is
#: about 15 levels): refused before anything recursive (copying, diffing, dumping) runs.
MAX_DEPTH = 100
_CONTAINER_LISTS = ("initContainers", "containers")
# bool before int: True is an int to isinstance
_JSON_NAMES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "a boolean"),
    (str, "a string"),
    ((int, float), "a number"),
    ((list, tuple), "a list"),
    (Mapping, "an object"),
)


def describe(value: Any) -> str:
    """What a JSON value is, as a message says it."""
    if value is None:
        return "null"
    for types, name in _JSON_NAMES:
        if isinstance(value, types):
            return name
    return type(value).__name__


def _wrong(where: str, expected: str, value: Any) -> InvalidInjection:
    return InvalidInjection(f"{where}: expected {expected}, got {describe(value)}")


def check_depth(value: Any, where: str = "the manifest") -> None:
    """Refuse ``value`` nested more than :data:`MAX_DEPTH` levels (iteratively: a check
    that recursed would fail as the work it guards does)."""
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        node, depth = pending.pop()
        if depth > MAX_DEPTH:
            raise InvalidInjection(
                f"{where} is nested more than {MAX_DEPTH} levels deep, which no Kubernetes "
                "object is"
            )
        if isinstance(node, Mapping):
            pending.extend((child, depth + 1) for child in node.values())
        elif isinstance(node, list | tuple):
            pending.extend((child, depth + 1) for child in node)


def mapping(value: Any, where: str, what: str = "an object") -> dict[str, Any]:
    """``value`` if it is an object; ``{}`` for an absent (null) one."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _wrong(where, what, value)
    return value


def items(value: Any, where: str) -> list[Any]:
    """``value`` if it is a list; ``[]`` for an absent (null) one."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _wrong(where, "a list", value)
    return value


def _string(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise InvalidInjection(
            f"{where}: expected a string, got {'nothing' if value is None else describe(value)}"
        )


def _objects(value: Any, where: str, what: str) -> list[dict[str, Any]]:
    """A list of objects (each named ``what`` in a message)."""
    listed = items(value, where)
    for index, item in enumerate(listed):
        if not isinstance(item, dict):
            raise _wrong(f"{where}[{index}]", f"an object ({what})", item)
    return listed


def check_metadata(metadata: Any, where: str, prefix: str) -> dict[str, Any]:
    """The metadata injection reads: labels and annotations (objects; the values of those
    under ``prefix`` strings, or numbers and booleans YAML left unquoted) and owner
    references (a list)."""
    checked = mapping(metadata, where)
    for field in ("labels", "annotations"):
        for key, value in mapping(checked.get(field), f"{where}.{field}").items():
            if str(key).startswith(prefix) and (value is None or isinstance(value, dict | list)):
                raise _wrong(f"{where}.{field}['{key}']", "a string", value)
    items(checked.get("ownerReferences"), f"{where}.ownerReferences")
    return checked


def _check_container(container: dict[str, Any], where: str) -> None:
    _string(container.get("name"), f"{where}.name")
    for index, variable in enumerate(_objects(container.get("env"), f"{where}.env", "a variable")):
        _string(variable.get("name"), f"{where}.env[{index}].name")
    mounts = _objects(container.get("volumeMounts"), f"{where}.volumeMounts", "a mount")
    for index, mount in enumerate(mounts):
        _string(mount.get("mountPath"), f"{where}.volumeMounts[{index}].mountPath")
    mapping(container.get("securityContext"), f"{where}.securityContext")


def check_pod_spec(spec: Any, where: str) -> dict[str, Any]:
    """The pod spec injection reads: containers, init containers (objects with a name,
    ``env`` entries with names, mounts with paths), volumes, the pod's security context
    and ``hostNetwork``."""
    if not isinstance(spec, dict):
        raise _wrong(where, "an object (a pod spec)", spec)
    for field in _CONTAINER_LISTS:
        for index, container in enumerate(
            _objects(spec.get(field), f"{where}.{field}", "a container")
        ):
            _check_container(container, f"{where}.{field}[{index}]")
    _objects(spec.get("volumes"), f"{where}.volumes", "a volume")
    mapping(spec.get("securityContext"), f"{where}.securityContext")
    host_network = spec.get("hostNetwork")
    if host_network is not None and not isinstance(host_network, bool):
        raise _wrong(f"{where}.hostNetwork", "true or false", host_network)
    return spec


def check_job_spec(spec: Mapping[str, Any], where: str) -> None:
    """What injection reads of a Job's spec: ``parallelism``, ``completions`` (integers)
    and ``completionMode`` (a string)."""
    for field in ("parallelism", "completions"):
        value = spec.get(field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _wrong(f"{where}.{field}", "an integer", value)
    mode = spec.get("completionMode")
    if mode is not None:
        _string(mode, f"{where}.completionMode")
