"""The injection configuration: what every injected pod gets, unless its annotations say
otherwise.  Loaded from YAML (keys as the field names); every default is usable as is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sidecar.errors import ConfigError

DEFAULT_IMAGE = "ghcr.io/effect-sidecar/effect-sidecar:0.1.0"
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")

type Mode = Literal["transparent", "env-proxy"]


class SecretKey(BaseModel):
    """One key of a Secret in the pod's namespace."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    key: str = Field(min_length=1)


class InjectConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str = DEFAULT_IMAGE
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = None
    mode: Mode = Field(default="transparent", description="default for pods that do not say")
    native_sidecar: bool = Field(
        default=True,
        description="run the sidecar as a native sidecar (an init container with "
        "restartPolicy: Always, Kubernetes 1.29+); false for older clusters",
    )
    run_as_user: int = Field(default=1337, ge=1, le=2**31 - 1)
    resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"memory": "512Mi"},
        }
    )
    redirect_resources: dict[str, dict[str, str]] = Field(
        default_factory=lambda: {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"memory": "64Mi"},
        }
    )
    control_token_secret: SecretKey = SecretKey(name="effect-sidecar-control", key="token")
    store_secret: SecretKey | None = Field(
        default=SecretKey(name="effect-sidecar-store", key="url"),
        description="Secret holding the store URL (postgresql://...); null keeps the "
        "default SQLite file in the pod's emptyDir, which dies with the pod",
    )
    store_password_key: str | None = Field(
        default="password",
        description="key of the store Secret given to the sidecar as PGPASSWORD (optional "
        "in the Secret: a store without a password needs none); null for none",
    )
    rules_configmap: str | None = Field(
        default=None,
        description="ConfigMap of rule files mounted and passed with --rules (replacing "
        "the shipped packs); a pod's effect-sidecar.io/rules-configmap annotation wins",
    )
    ca_secret: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="name of a TLS Secret (tls.crt, tls.key) in the pod's namespace holding "
        "the interception CA: mounted read-only into the sidecar alone and passed as "
        "--ca-from, so all pods of the namespace share one CA; null: each sidecar creates "
        "its own",
    )
    namespace: str = Field(
        default="effect-sidecar", description="where the webhook runs; never injected"
    )
    skip_namespaces: tuple[str, ...] = SYSTEM_NAMESPACES

    def skips(self, namespace: str) -> bool:
        return namespace in self.skip_namespaces or namespace == self.namespace


def load_config(path: Path | None) -> InjectConfig:
    """The configuration in ``path`` (YAML), or the defaults; a bad file is a ConfigError."""
    if path is None:
        return InjectConfig()
    try:
        loaded: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read injection config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return InjectConfig()
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    try:
        return InjectConfig.model_validate({str(k).replace("-", "_"): v for k, v in loaded.items()})
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in error['loc']) or '?'}: {error['msg']}"
            for error in exc.errors()
        ]
        raise ConfigError(f"{path}: " + "; ".join(problems)) from exc
