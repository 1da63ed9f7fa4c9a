"""Routes of a task's history: stage checkpoints and the effect audit trail, paginated."""

from __future__ import annotations

import asyncio

from aiohttp import web

from sidecar.control.endpoints import TASK_PROBLEMS, Api, json_answer, parse_body, task_param
from sidecar.control.keys import STORE
from sidecar.control.pages import cut, json_body, page_request, position
from sidecar.control.schemas import (
    CheckpointCreated,
    CheckpointList,
    CheckpointOut,
    CheckpointRequest,
    EffectList,
    with_trails,
)
from sidecar.domain.model import Checkpoint, Effect, EffectEvent
from sidecar.errors import InvalidRequest, NotFound
from sidecar.store import Store
from sidecar.store.rows import to_us

api = Api("history")


@api.route(
    "POST",
    "/v1/tasks/{task}/checkpoints",
    summary="Append a stage checkpoint, fenced by (attempt_id, generation).",
    body=CheckpointRequest,
    status=201,
    answer=CheckpointCreated,
    problems=("stale_generation", *TASK_PROBLEMS),
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


def _page_of_checkpoints(task: str, found: list[Checkpoint], limit: int) -> bytes:
    page, cursor = cut(found, limit, "checkpoints", lambda c: c.seq)
    checkpoints = [CheckpointOut.model_validate(c) for c in page]
    answer = CheckpointList(task=task, checkpoints=checkpoints, next_cursor=cursor)
    return answer.model_dump_json().encode()


def _page_of_effects(
    task: str, found: list[Effect], events: list[EffectEvent], limit: int
) -> bytes:
    page, cursor = cut(found, limit, "effects", lambda e: [to_us(e.created_at), e.key])
    answer = EffectList(task=task, effects=with_trails(page, events), next_cursor=cursor)
    return answer.model_dump_json().encode()


@api.route(
    "GET",
    "/v1/tasks/{task}/checkpoints",
    summary="The task's checkpoints, oldest first, a page at a time.",
    answer=CheckpointList,
    problems=TASK_PROBLEMS,
    paginated=True,
)
async def list_checkpoints(request: web.Request) -> web.Response:
    task = task_param(request)
    asked = page_request(request, "checkpoints")
    after = asked.after if asked.after is not None else 0
    if not isinstance(after, int) or isinstance(after, bool):
        raise InvalidRequest("the cursor does not hold a checkpoint position")
    store = request.app[STORE]
    # One more than the page: whether a next page exists, without counting them all.
    found = await store.checkpoints_page(task, after, asked.limit + 1)
    if not found and asked.after is None:
        await _known(store, task)
    # Built and serialised off the event loop: the proxy shares it.
    return json_body(await asyncio.to_thread(_page_of_checkpoints, task, found, asked.limit))


@api.route(
    "GET",
    "/v1/tasks/{task}/effects",
    summary=(
        "The task's effect log with each effect's audit trail (which attempt did what), "
        "oldest first, a page at a time."
    ),
    answer=EffectList,
    problems=TASK_PROBLEMS,
    paginated=True,
)
async def list_effects(request: web.Request) -> web.Response:
    task = task_param(request)
    asked = page_request(request, "effects")
    after = position(asked, 1)
    store = request.app[STORE]
    found = await store.effects_page(task, after, asked.limit + 1)
    if not found and after is None:
        await _known(store, task)
    events = await store.effect_events_of([(task, e.key) for e in found[: asked.limit]])
    body = await asyncio.to_thread(_page_of_effects, task, found, events, asked.limit)
    return json_body(body)
