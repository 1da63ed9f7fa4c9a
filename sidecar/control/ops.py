"""Operational routes: liveness, readiness, shutdown, Prometheus metrics, the OpenAPI
document."""

from __future__ import annotations

import asyncio
import functools
import json
import logging

from aiohttp import web

from sidecar.control.endpoints import Api, Endpoint, json_answer
from sidecar.control.keys import CLOCK, METRICS, PROXY, READINESS, SHUTDOWN, STORE
from sidecar.control.openapi import build as build_openapi
from sidecar.control.schemas import Health, ProxyOut, Readiness, Stopping
from sidecar.errors import NotFound, SidecarError

log = logging.getLogger("sidecar.control")

api = Api("operations")
#: Every endpoint of the app; the document is built from them on first request (building
#: JSON Schemas for every model costs memory a sidecar that is never asked would waste).
ENDPOINTS: web.AppKey[tuple[Endpoint, ...]] = web.AppKey("endpoints")


@api.route("GET", "/healthz", summary="The process is alive.", answer=Health)
async def healthz(request: web.Request) -> web.Response:
    return json_answer(Health(status="ok"))


@api.route(
    "GET",
    "/readyz",
    summary="Ready: every part of the sidecar is in place (the proxy answers, the "
    "PostgreSQL relay listens, the --task lease is held) and the store accepted a durable "
    "test write (insert + delete).",
    answer=Readiness,
    problems=("not_ready", "store_unavailable"),
)
async def readyz(request: web.Request) -> web.Response:
    request.app[READINESS].check()
    store = request.app[STORE]
    await store.check_writable()
    info = await store.info()
    return json_answer(
        Readiness(
            status="ready",
            store={
                "backend": info.backend,
                "schema_version": info.schema_version,
                "durable": info.durable,
            },
        )
    )


@api.route(
    "POST",
    "/v1/shutdown",
    summary="Stop the sidecar as SIGTERM would (listeners closed, the --task lease "
    "released, the store closed); the process then exits 0. How a Job whose sidecar is a "
    "regular container ends: the agent's command calls it last. Open without the token "
    "from loopback (the pod's own containers), like the probes; a stopped sidecar fails "
    "closed, it never lets traffic past unrecorded.",
    status=202,
    answer=Stopping,
    problems=("not_found", "unauthorized"),
)
async def shutdown(request: web.Request) -> web.Response:
    stop = request.app.get(SHUTDOWN)
    if stop is None:
        raise NotFound("this control API is not a sidecar process's: nothing to stop")
    # After the answer is sent: stopping closes this very listener.
    asyncio.get_running_loop().call_later(0.05, stop)
    return json_answer(Stopping(status="stopping"), status=202)


@api.route(
    "GET",
    "/metrics",
    summary="Prometheus text exposition.",
    content_type="text/plain",
    problems=("unauthorized",),
)
async def metrics(request: web.Request) -> web.Response:
    registry = request.app[METRICS]
    try:
        # Two counts on indexed columns: cheap enough for every scrape.
        unknown, leased = await request.app[STORE].gauges(request.app[CLOCK].now())
    except SidecarError as error:  # a scrape still answers; the gauges keep their last value
        log.warning("metrics: the gauges could not be read: %s", error.detail)
    else:
        registry.effects_awaiting_human.set(unknown)
        registry.live_leases.set(leased)
    response = web.Response(body=registry.render())
    response.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
    return response


@api.route(
    "GET",
    "/v1/proxy",
    summary="The proxy's address, mode, CA and rules (what `sidecar exec` wires agents to).",
    answer=ProxyOut,
    problems=("not_found", "unauthorized"),
)
async def proxy_info(request: web.Request) -> web.Response:
    info = request.app.get(PROXY)
    if info is None:
        raise NotFound("this sidecar runs no proxy")
    return json_answer(
        ProxyOut(
            proxy_url=info.proxy_url,
            mode=info.mode,
            ca_cert=info.ca_cert,
            ca_bundle=info.ca_bundle,
            rules=info.rules,
            routes=info.routes,
            pg_relay=info.pg_relay[0][0] if info.pg_relay else None,
            pg_upstream_port=info.pg_relay[0][1] if info.pg_relay else None,
        )
    )


@api.route("GET", "/openapi.json", summary="This document.", problems=("unauthorized",))
async def openapi(request: web.Request) -> web.Response:
    endpoints = request.app[ENDPOINTS]
    return web.Response(text=_document(endpoints), content_type="application/json")


@functools.cache
def _document(endpoints: tuple[Endpoint, ...]) -> str:
    return json.dumps(build_openapi(endpoints))
