"""Routes of a task's history: stage checkpoints and the effect audit trail."""

from __future__ import annotations

from collections import defaultdict

from aiohttp import web

from sidecar.control.endpoints import Api, json_answer, parse_body, task_param
from sidecar.control.keys import STORE
from sidecar.control.schemas import (
    CheckpointCreated,
    CheckpointList,
    CheckpointOut,
    CheckpointRequest,
    EffectList,
    EffectOut,
)
from sidecar.domain.model import EffectEvent
from sidecar.errors import NotFound
from sidecar.store import Store

api = Api("history")
_READ_PROBLEMS = ("not_found", "invalid_request", "store_unavailable", "unauthorized")


@api.route(
    "POST",
    "/v1/tasks/{task}/checkpoints",
    summary="Append a stage checkpoint, fenced by (attempt_id, generation).",
    body=CheckpointRequest,
    status=201,
    answer=CheckpointCreated,
    problems=(
        "stale_generation",
        "not_found",
        "invalid_request",
        "store_unavailable",
        "unauthorized",
    ),
)
async def append_checkpoint(request: web.Request) -> web.Response:
    task = task_param(request)
    body = await parse_body(request, CheckpointRequest)
    written = await request.app[STORE].append_checkpoint(
        task, body.attempt_id, body.generation, body.stage, dict(body.outputs)
    )
    answer = CheckpointCreated(
        task=task,
        seq=written.seq,
        stage=written.stage,
        generation=written.generation,
        created_at=written.created_at,
    )
    return json_answer(answer, status=201)


async def _known(store: Store, task: str) -> None:
    if await store.task_view(task) is None:
        raise NotFound(f"task {task} has never been claimed")


@api.route(
    "GET",
    "/v1/tasks/{task}/checkpoints",
    summary="Every checkpoint of the task, oldest first.",
    answer=CheckpointList,
    problems=_READ_PROBLEMS,
)
async def list_checkpoints(request: web.Request) -> web.Response:
    task = task_param(request)
    store = request.app[STORE]
    history = await store.checkpoints(task)
    if not history:
        await _known(store, task)
    return json_answer(
        CheckpointList(task=task, checkpoints=[CheckpointOut.of(c) for c in history])
    )


@api.route(
    "GET",
    "/v1/tasks/{task}/effects",
    summary="The task's effect log with each effect's audit trail (which attempt did what).",
    answer=EffectList,
    problems=_READ_PROBLEMS,
)
async def list_effects(request: web.Request) -> web.Response:
    task = task_param(request)
    store = request.app[STORE]
    effects = await store.effects(task)
    if not effects:
        await _known(store, task)
    trail: dict[str, list[EffectEvent]] = defaultdict(list)
    for event in await store.effect_events(task):
        trail[event.key].append(event)
    answer = EffectList(task=task, effects=[EffectOut.of(e, trail[e.key]) for e in effects])
    return json_answer(answer)
