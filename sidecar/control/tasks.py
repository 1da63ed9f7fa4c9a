"""Routes of the task resource: claim, heartbeat, release, done, reopen, and its state."""

from __future__ import annotations

from aiohttp import web

from sidecar.control.endpoints import (
    STORE_PROBLEMS,
    TASK_PROBLEMS,
    Api,
    json_answer,
    parse_body,
    task_param,
)
from sidecar.control.keys import BEFORE_RELEASE, CLOCK, STORE
from sidecar.control.schemas import (
    ClaimRequest,
    ClaimResponse,
    DoneRequest,
    HeartbeatRequest,
    LeaseResponse,
    ReleaseRequest,
    ReopenRequest,
    TaskOut,
)
from sidecar.errors import NotFound

api = Api("tasks")


@api.route(
    "POST",
    "/v1/tasks/{task}/claim",
    summary="Start a new attempt: new attempt id, generation + 1, lease until now + ttl_s.",
    body=ClaimRequest,
    answer=ClaimResponse,
    problems=("lease_held", "task_done", *STORE_PROBLEMS),
)
async def claim(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, ClaimRequest)
    granted = await request.app[STORE].claim(task, body.worker, body.ttl_s)
    return json_answer(ClaimResponse.model_validate(granted))


@api.route(
    "POST",
    "/v1/tasks/{task}/heartbeat",
    summary="Extend the lease of the current attempt.",
    body=HeartbeatRequest,
    answer=LeaseResponse,
    problems=("stale_generation", *TASK_PROBLEMS),
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
    problems=("stale_generation", *TASK_PROBLEMS),
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


async def _task_out(request: web.Request, task: str) -> web.Response:
    store = request.app[STORE]
    view = await store.task_view(task)
    if view is None:
        raise NotFound(f"task {task} has never been claimed")
    refusals = await store.refusals(task)
    return json_answer(TaskOut.of(view, refusals, request.app[CLOCK].now()))


@api.route(
    "POST",
    "/v1/tasks/{task}/done",
    summary="Mark the task done: claims get 409 task_done until it is reopened. By the "
    "lease holder with its attempt_id and generation (its lease is released), or by an "
    "operator without them while no lease is live (409 lease_held otherwise). Marking a "
    "done task done again changes nothing.",
    body=DoneRequest,
    answer=TaskOut,
    problems=("lease_held", "stale_generation", *TASK_PROBLEMS),
)
async def done(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, DoneRequest)
    token = None
    if body.attempt_id is not None and body.generation is not None:
        token = (body.attempt_id, body.generation)
    by = (body.by or (body.attempt_id if token else None) or "operator").strip()
    note = body.note.strip() if body.note is not None else None
    await request.app[STORE].mark_done(task, by, note, token)
    return await _task_out(request, task)


@api.route(
    "POST",
    "/v1/tasks/{task}/reopen",
    summary="Make a done task claimable again; who reopened it and why are kept. "
    "Reopening a task that is not done changes nothing.",
    body=ReopenRequest,
    answer=TaskOut,
    problems=TASK_PROBLEMS,
)
async def reopen(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, ReopenRequest)
    await request.app[STORE].reopen(task, body.by.strip(), body.note.strip())
    return await _task_out(request, task)


@api.route(
    "GET",
    "/v1/tasks/{task}",
    summary="Lease, attempts, last checkpoint, effect counts by state, refused writes, "
    "done/reopened.",
    answer=TaskOut,
    problems=TASK_PROBLEMS,
)
async def get_task(request: web.Request) -> web.Response:
    return await _task_out(request, task_param(request))
