"""Typed keys for what the control app shares between its handlers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from sidecar.proxy.exchange import Sender
from sidecar.rules import RuleSet
from sidecar.runtime.clock import Clock
from sidecar.runtime.metrics import Metrics
from sidecar.serve.readiness import Readiness
from sidecar.store import Store

STORE = web.AppKey("store", Store)
CLOCK = web.AppKey("clock", Clock)
METRICS = web.AppKey("metrics", Metrics)
READINESS = web.AppKey("readiness", Readiness)
#: Asks the sidecar process to stop as on SIGTERM (``POST /v1/shutdown``).
SHUTDOWN: web.AppKey[Callable[[], None]] = web.AppKey("shutdown")
#: Awaited with (task, attempt_id) before that attempt's lease is released: its writes and
#: forwards still in flight land first.
BEFORE_RELEASE: web.AppKey[Callable[[str, str], Awaitable[None]]] = web.AppKey("before_release")


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    """What ``sidecar exec`` needs to wire an agent to this sidecar's proxy."""

    proxy_url: str
    mode: str
    ca_cert: str
    ca_bundle: str
    rules: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    #: the PostgreSQL relay's HOST:PORT and its server's port, once the relay listens
    #: (it starts after the control API: filled in then, hence a list); ``sidecar exec``
    #: lets an isolated agent reach the relay, and redirects the server's port to it
    pg_relay: list[tuple[str, int | None]] = field(default_factory=list)


PROXY = web.AppKey("proxy", ProxyInfo)
#: The sidecar's rules: how long a request of an effect may still land (resolutions).
RULES = web.AppKey("rules", RuleSet)
#: The proxy's upstream client (its --route table): what resume checks probe through.
UPSTREAM: web.AppKey[Sender] = web.AppKey("upstream")
