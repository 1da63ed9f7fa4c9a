"""The one place that reads settings: defaults < config file < ``SIDECAR_*`` env < flags.

Every ``sidecar serve`` flag has a field here of the same name (``--control-listen`` is
``control_listen``, env ``SIDECAR_CONTROL_LISTEN``, config-file key ``control_listen``).
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from sidecar.domain.ids import TASK_PATTERN
from sidecar.errors import ConfigError

DEFAULT_CONTROL_LISTEN = "127.0.0.1:7300"
DEFAULT_PROXY_LISTEN = "127.0.0.1:7301"
DEFAULT_PG_LISTEN = "127.0.0.1:7302"


def default_data_dir() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "effect-sidecar"


def parse_listen(value: str, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """``HOST:PORT``, ``[v6]:PORT`` or ``:PORT``; port 0 picks a free one."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    return (host.strip("[]") or default_host), int(port)


def control_url(given: str) -> str:
    """A control API address as given (``HOST:PORT`` or a URL) as a URL, no trailing /."""
    url = given.rstrip("/")
    return url if "://" in url else f"http://{url}"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    data_dir: Path = Field(default_factory=default_data_dir)
    store: str | None = Field(
        default=None, description="Store URL; default sqlite:///DATA_DIR/effects.db."
    )
    control_listen: str = DEFAULT_CONTROL_LISTEN
    control_token_file: Path | None = None
    control_token: SecretStr | None = None
    log_level: str = "info"
    proxy_listen: str = DEFAULT_PROXY_LISTEN
    mode: str = Field(default="regular", description="regular | transparent | reverse:URL")
    rules: list[Path] = Field(
        default_factory=list, description="Rule files or folders; default: the shipped packs."
    )
    route: list[str] = Field(default_factory=list, description="HOST=URL, repeatable.")
    upstream_ca: Path | None = Field(
        default=None, description="Extra CA (PEM) trusted for upstream TLS, e.g. a test server."
    )
    ca_from: Path | None = Field(
        default=None,
        description="Directory with the CA to use (tls.crt or ca.crt, and tls.key: a "
        "Kubernetes TLS Secret); default: a CA created in DATA_DIR/ca.",
    )
    ca_bundle: Path | None = Field(
        default=None,
        description="Where to write the trust bundle (system roots + the CA) agents are "
        "given; default DATA_DIR/ca-bundle.pem. Kubernetes pods put it on a volume of its "
        "own so that app containers never mount DATA_DIR (the CA key is there).",
    )
    task: str | None = Field(
        default=None,
        # The control API's task pattern: a task named here is one it can be asked about.
        # (pydantic's regex engine ends "$" at the end of the text, newline or not.)
        pattern=TASK_PATTERN,
        description="Task this sidecar works on itself.",
    )
    worker: str = Field(default_factory=socket.gethostname)
    lease_ttl_s: float = Field(default=60.0, gt=0, le=86_400)
    self_fence_margin_s: float = Field(default=2.0, ge=0)
    pg_listen: str = DEFAULT_PG_LISTEN
    pg_upstream: str | None = Field(
        default=None,
        description="postgresql://HOST:PORT[?sslmode=require|verify-ca|verify-full"
        "&sslrootcert=FILE]; enables the relay",
    )
    pg_upstream_ca: Path | None = Field(
        default=None,
        description="CA (PEM) the PostgreSQL server's certificate must chain to (default: "
        "the system roots), when the relay speaks TLS to it.",
    )
    store_retry_s: float = Field(default=2.0, ge=0)
    notify: str | None = Field(
        default=None,
        description="http(s) URL that gets a JSON POST when a human is needed (effect_blocked, "
        "stale_write_refused, lease_taken_over)",
        pattern=r"^https?://\S+$",  # pydantic's Rust regex: $ is the very end
    )
    uncovered_writes: Literal["log", "record", "deny"] = Field(
        default="log",
        description="Writes no rule matches: log (once per host, method and path shape), "
        "record (also in the bound task's effect log) or deny (403 uncovered_write).",
    )

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        if value in {"regular", "transparent"} or value.startswith(
            ("reverse:http://", "reverse:https://")
        ):
            return value
        raise ValueError("one of regular, transparent, reverse:http(s)://HOST[:PORT]")

    @field_validator("control_listen", "proxy_listen", "pg_listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        try:
            parse_listen(value)
        except ConfigError as error:
            raise ValueError(error.detail) from error
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("one of debug, info, warning, error")
        return value.lower()

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir.expanduser().absolute()}/effects.db"

    def token(self) -> str | None:
        """The control-API bearer token, from the token file or the env/config value."""
        if self.control_token_file is not None:
            try:
                token = self.control_token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ConfigError(f"cannot read control token file: {exc}") from exc
            if not token:
                raise ConfigError(f"control token file {self.control_token_file} is empty")
            return token
        return self.control_token.get_secret_value() if self.control_token else None


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """``SIDECAR_<FIELD>`` variables; list fields take JSON (``["a", "b"]``) or commas."""
    values: dict[str, Any] = {}
    for name, info in Settings.model_fields.items():
        raw = environ.get(f"SIDECAR_{name.upper()}")
        if raw is None:
            continue
        if get_origin(info.annotation) is list:
            values[name] = (
                json.loads(raw)
                if raw.lstrip().startswith("[")
                else [item.strip() for item in raw.split(",") if item.strip()]
            )
        else:
            values[name] = raw
    return values


def _file_layer(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: expected a mapping of settings at the top level")
    return {str(k).replace("-", "_"): v for k, v in loaded.items()}


def load(flags: dict[str, Any], config_file: Path | None = None) -> Settings:
    """Merge the layers; a bad value is a ConfigError naming where it came from."""
    return load_with_origins(flags, config_file)[0]


def load_with_origins(
    flags: dict[str, Any], config_file: Path | None = None
) -> tuple[Settings, dict[str, str]]:
    """:func:`load`, and where each setting that is not a default came from (``"config
    file FILE"``, ``"environment (SIDECAR_*)"``, ``"command line"``), by field name."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file is not None:
        layers.append((f"config file {config_file}", _file_layer(config_file)))
    try:
        layers.append(("environment (SIDECAR_*)", _env_layer(os.environ)))
    except ValueError as exc:
        raise ConfigError(f"a SIDECAR_* list variable is not valid JSON: {exc}") from exc
    layers.append(("command line", {k: v for k, v in flags.items() if v is not None}))
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name, values in layers:
        merged.update(values)
        origin.update(dict.fromkeys(values, name))
    try:
        return Settings.model_validate(merged), origin
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "?"
            problems.append(f"{field} ({origin.get(field, 'default')}): {error['msg']}")
        raise ConfigError("invalid settings: " + "; ".join(problems)) from exc
