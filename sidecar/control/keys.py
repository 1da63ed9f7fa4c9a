"""Typed keys for what the control app shares between its handlers."""

from __future__ import annotations

from aiohttp import web

from sidecar.clock import Clock
from sidecar.metrics import Metrics
from sidecar.store import Store

STORE = web.AppKey("store", Store)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)
