"""``sidecar inject``: inject the sidecar into manifests offline (like ``istioctl kube-inject``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml

from sidecar.errors import InvalidInjection

if TYPE_CHECKING:
    from sidecar.kube.config import InjectConfig

DEFAULT_NAMESPACE = "default"


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "inject",
        help="inject the sidecar into Kubernetes manifests (offline)",
        description="Read multi-document YAML, inject the sidecar into every Pod, "
        "Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and CronJob (also inside List "
        'kinds) whose pod template says effect-sidecar.io/inject: "true", and write all '
        "documents to stdout; everything else passes through unchanged. Warnings (a Job "
        "whose pods would share one task, a CA variable an app sets itself, ...) go to "
        "stderr; a manifest that cannot be injected (a bad annotation, a field of the wrong "
        "shape, a hostNetwork pod) is an error naming the file, document and object, and "
        "nothing is written.",
    )
    parser.add_argument(
        "-f",
        "--filename",
        dest="files",
        action="append",
        required=True,
        metavar="FILE",
        help="manifest file, '-' for stdin (repeatable)",
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="injection configuration (YAML)"
    )
    parser.add_argument(
        "--namespace",
        metavar="NS",
        help=f"namespace of documents that name none (default {DEFAULT_NAMESPACE})",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.kube.config import load_config  # noqa: PLC0415 - only this verb needs it

    config = load_config(args.config)
    documents: list[Any] = []
    warnings: list[str] = []
    for name in args.files:
        documents += _inject_file(name, args.namespace, config, warnings)
    write(documents, sys.stdout)
    # Only once everything was injected: a refused file prints its error alone.
    for warning in warnings:
        print(f"sidecar inject: warning: {warning}", file=sys.stderr)
    return 0


def _read(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidInjection(f"cannot read {name}: {exc}") from exc


def _load(name: str) -> list[Any]:
    """The file's documents; refused naming the file when they are not YAML."""
    shown = _shown(name)
    try:
        return [doc for doc in yaml.safe_load_all(_read(name)) if doc is not None]
    except yaml.YAMLError as exc:
        raise InvalidInjection(f"{shown}: not valid YAML: {exc}") from exc
    except RecursionError:  # the YAML composer recurses once per level of nesting
        raise InvalidInjection(f"{shown}: nested too deeply to be a manifest") from None


def _inject_file(
    name: str, namespace: str | None, config: InjectConfig, warnings: list[str]
) -> list[Any]:
    from sidecar.kube import shape  # noqa: PLC0415

    shown = _shown(name)
    out: list[Any] = []
    for index, document in enumerate(_load(name)):
        where = f"{shown}: document {index}"
        try:
            # before anything recursive (injecting, dumping) walks it
            shape.check_depth(document, "the document")
            out.append(_inject_document(document, namespace, config, warnings, where))
        except InvalidInjection as error:
            raise InvalidInjection(
                f"{where} ({_label(document)}): {error.detail}", annotation=error.annotation
            ) from error
    return out


def _inject_document(
    document: Any, namespace: str | None, config: InjectConfig, warnings: list[str], where: str
) -> Any:
    """``document`` injected; a List's items each (errors and warnings name the item)."""
    from sidecar.kube import shape  # noqa: PLC0415
    from sidecar.kube.inject import inject  # noqa: PLC0415

    def injected(manifest: dict[str, Any], shown: str) -> dict[str, Any]:
        outcome = inject(manifest, _namespace(manifest, namespace), config)
        warnings.extend(f"{shown}: {warning}" for warning in outcome.warnings)
        return outcome.manifest

    if not isinstance(document, dict):
        return document
    if not str(document.get("kind", "")).endswith("List"):
        return injected(document, f"{where} ({_label(document)})")
    out = []
    for number, item in enumerate(shape.items(document.get("items"), "items")):
        if not isinstance(item, dict):
            out.append(item)
            continue
        listed = f"item {number} ({_label(item)})"
        try:
            out.append(injected(item, f"{where} ({_label(document)}): {listed}"))
        except InvalidInjection as error:
            raise InvalidInjection(
                f"{listed}: {error.detail}", annotation=error.annotation
            ) from error
    document["items"] = out
    return document


def _shown(name: str) -> str:
    return "stdin" if name == "-" else name


def _label(document: Any) -> str:
    """``Kind name`` of a document, as an error or a warning names it."""
    from sidecar.kube.shape import describe  # noqa: PLC0415

    if not isinstance(document, dict):
        return describe(document)
    metadata = document.get("metadata")
    metadata = metadata if isinstance(metadata, dict) else {}
    name = metadata.get("name") or metadata.get("generateName") or "?"
    return f"{document.get('kind') or '?'} {name}"


def _namespace(document: dict[str, Any], default: str | None) -> str:
    metadata = document.get("metadata")
    # a metadata of the wrong shape is inject()'s to refuse, naming it
    named = metadata.get("namespace") if isinstance(metadata, dict) else None
    return str(named or default or DEFAULT_NAMESPACE)


def write(documents: list[Any], stream: TextIO) -> None:
    yaml.safe_dump_all(documents, stream, sort_keys=False, explicit_start=True)
