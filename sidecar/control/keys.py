"""Typed keys for what the control app shares between its handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from sidecar.clock import Clock
from sidecar.metrics import Metrics
from sidecar.store import Store

STORE = web.AppKey("store", Store)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    """What ``sidecar exec`` needs to wire an agent to this sidecar's proxy."""

    proxy_url: str
    mode: str
    ca_cert: str
    ca_bundle: str
    rules: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)


PROXY = web.AppKey("proxy", ProxyInfo)
