"""Operational routes: liveness, readiness, Prometheus metrics, the OpenAPI document."""

from __future__ import annotations

import functools
import json

from aiohttp import web

from sidecar.control.endpoints import Api, Endpoint, json_answer
from sidecar.control.keys import METRICS, PROXY, STORE
from sidecar.control.openapi import build as build_openapi
from sidecar.control.schemas import Health, ProxyOut, Readiness
from sidecar.errors import NotFound

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
    summary="Ready: the store accepted a durable test write (insert + delete).",
    answer=Readiness,
    problems=("store_unavailable",),
)
async def readyz(request: web.Request) -> web.Response:
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
    "GET",
    "/metrics",
    summary="Prometheus text exposition.",
    content_type="text/plain",
    problems=("unauthorized",),
)
async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=request.app[METRICS].render())
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
        )
    )


@api.route("GET", "/openapi.json", summary="This document.", problems=("unauthorized",))
async def openapi(request: web.Request) -> web.Response:
    endpoints = request.app[ENDPOINTS]
    return web.Response(text=_document(endpoints), content_type="application/json")


@functools.cache
def _document(endpoints: tuple[Endpoint, ...]) -> str:
    return json.dumps(build_openapi(endpoints))
