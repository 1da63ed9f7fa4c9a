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
        "documents to stdout; everything else passes through unchanged.",
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


def _inject_file(
    name: str, namespace: str | None, config: InjectConfig, warnings: list[str]
) -> list[Any]:
    from sidecar.kube.inject import inject  # noqa: PLC0415

    shown = "stdin" if name == "-" else name
    try:
        loaded = [doc for doc in yaml.safe_load_all(_read(name)) if doc is not None]
    except yaml.YAMLError as exc:
        raise InvalidInjection(f"{shown}: not valid YAML: {exc}") from exc
    out: list[Any] = []

    def injected(document: dict[str, Any], index: int) -> dict[str, Any]:
        outcome = inject(document, _namespace(document, namespace), config)
        warnings.extend(f"{shown}: document {index}: {warning}" for warning in outcome.warnings)
        return outcome.manifest

    for index, document in enumerate(loaded):
        try:
            if isinstance(document, dict) and str(document.get("kind", "")).endswith("List"):
                items = document.get("items") or []
                document["items"] = [
                    injected(item, index) if isinstance(item, dict) else item for item in items
                ]
                out.append(document)
            elif isinstance(document, dict):
                out.append(injected(document, index))
            else:
                out.append(document)
        except InvalidInjection as error:
            raise InvalidInjection(
                f"{shown}: document {index}: {error.detail}", annotation=error.annotation
            ) from error
    return out


def _namespace(document: dict[str, Any], default: str | None) -> str:
    metadata = document.get("metadata") or {}
    return str(metadata.get("namespace") or default or DEFAULT_NAMESPACE)


def write(documents: list[Any], stream: TextIO) -> None:
    yaml.safe_dump_all(documents, stream, sort_keys=False, explicit_start=True)
