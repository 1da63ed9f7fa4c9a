"""Routes of the task resource: claim, heartbeat, release, and the task's state."""

from __future__ import annotations

from aiohttp import web

from sidecar.control.endpoints import Api, json_answer, parse_body, task_param
from sidecar.control.keys import BEFORE_RELEASE, CLOCK, STORE
from sidecar.control.schemas import (
    ClaimRequest,
    ClaimResponse,
    HeartbeatRequest,
    LeaseResponse,
    ReleaseRequest,
    TaskOut,
)
from sidecar.errors import NotFound

api = Api("tasks")
_WRITE_PROBLEMS = ("invalid_request", "store_unavailable", "unauthorized")


@api.route(
    "POST",
    "/v1/tasks/{task}/claim",
    summary="Start a new attempt: new attempt id, generation + 1, lease until now + ttl_s.",
    body=ClaimRequest,
    answer=ClaimResponse,
    problems=("lease_held", *_WRITE_PROBLEMS),
)
async def claim(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, ClaimRequest)
    granted = await request.app[STORE].claim(task, body.worker, body.ttl_s)
    return json_answer(ClaimResponse.of(granted))


@api.route(
    "POST",
    "/v1/tasks/{task}/heartbeat",
    summary="Extend the lease of the current attempt.",
    body=HeartbeatRequest,
    answer=LeaseResponse,
    problems=("stale_generation", "not_found", *_WRITE_PROBLEMS),
)
async def heartbeat(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, HeartbeatRequest)
    state = await request.app[STORE].heartbeat(task, body.attempt_id, body.generation, body.ttl_s)
    return json_answer(LeaseResponse.of(state, request.app[CLOCK].now()))


@api.route(
    "POST",
    "/v1/tasks/{task}/release",
    summary="Give the lease up (idempotent for its own attempt); `end` says how the "
    "attempt's agent ended and is kept with the attempt.",
    body=ReleaseRequest,
    answer=LeaseResponse,
    problems=("stale_generation", "not_found", *_WRITE_PROBLEMS),
)
async def release(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, ReleaseRequest)
    settle = request.app.get(BEFORE_RELEASE)
    if settle is not None:
        # What the attempt still has in flight (forwards awaiting the upstream's answer, the
        # PostgreSQL relay's background writes) lands first, so the next attempt finds
        # outcomes, not pending effects it must guess about (SPEC §3.7).
        await settle(task, body.attempt_id)
    end = body.end.to_domain() if body.end is not None else None
    state = await request.app[STORE].release(task, body.attempt_id, body.generation, end)
    return json_answer(LeaseResponse.of(state, request.app[CLOCK].now()))


@api.route(
    "GET",
    "/v1/tasks/{task}",
    summary="Lease, attempts, last checkpoint, effect counts by state, refused writes.",
    answer=TaskOut,
    problems=("not_found", "invalid_request", "store_unavailable", "unauthorized"),
)
async def get_task(request: web.Request) -> web.Response:
    task = task_param(request)
    store = request.app[STORE]
    view = await store.task_view(task)
    if view is None:
        raise NotFound(f"task {task} has never been claimed")
    refusals = await store.refusals(task)
    return json_answer(TaskOut.of(view, refusals, request.app[CLOCK].now()))
