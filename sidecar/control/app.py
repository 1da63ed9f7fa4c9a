"""The control API's aiohttp application factory."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from sidecar.control import (
    console,
    history,
    listings,
    ops,
    resume,
    review,
    ruleset,
    settle,
    tasks,
)
from sidecar.control.auth import bearer_middleware
from sidecar.control.keys import (
    BEFORE_RELEASE,
    CLOCK,
    METRICS,
    PROXY,
    READINESS,
    RULES,
    SHUTDOWN,
    STORE,
    ProxyInfo,
)
from sidecar.control.problems import problem_middleware
from sidecar.rules import RuleSet
from sidecar.runtime.clock import Clock, SystemClock
from sidecar.runtime.metrics import Metrics
from sidecar.serve.readiness import Readiness
from sidecar.store import Store

# 1 MiB of JSON is far more than any checkpoint should carry; larger bodies get a 413.
MAX_BODY_BYTES = 1024 * 1024
APIS = (
    tasks.api,
    listings.api,
    history.api,
    settle.api,
    ops.api,
    review.api,
    resume.api,
    ruleset.api,
    console.api,
)
# The order the router tries them in.  aiohttp matches every resource under
# /v1/tasks/{task}/... one after another, in registration order, so an agent's hot path
# (checkpoints, then claim/heartbeat/release) goes first: registered after the task
# routes, a checkpoint paid six regex matches and awaits before its own (bench/
# control_api.py).  No two of these paths match the same URL, so the order changes
# nothing but the cost; /openapi.json keeps the order of APIS.
ROUTING_ORDER = (history.api, *(api for api in APIS if api is not history.api))


def make_app(
    store: Store,
    *,
    metrics: Metrics | None = None,
    clock: Clock | None = None,
    token: str | None = None,
    proxy: ProxyInfo | None = None,
    readiness: Readiness | None = None,
    shutdown: Callable[[], None] | None = None,
    before_release: Callable[[str, str], Awaitable[None]] | None = None,
    rules: RuleSet | None = None,
) -> web.Application:
    """The control app over an *open* store (its owner opens and closes it); ``/readyz``
    also waits for ``readiness``'s conditions, ``POST /v1/shutdown`` calls ``shutdown``."""
    middlewares: list[Middleware] = [problem_middleware]
    if token:
        middlewares.append(bearer_middleware(token))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY_BYTES)
    app[STORE] = store
    app[CLOCK] = clock or SystemClock()
    app[METRICS] = metrics or Metrics()
    if proxy is not None:
        app[PROXY] = proxy
    app[READINESS] = readiness or Readiness()
    if shutdown is not None:
        app[SHUTDOWN] = shutdown
    if before_release is not None:
        app[BEFORE_RELEASE] = before_release
    if rules is not None:
        app[RULES] = rules
    app[ops.ENDPOINTS] = tuple(e for api in APIS for e in api.endpoints)
    for api in ROUTING_ORDER:
        app.add_routes(api.routes)
    return app
