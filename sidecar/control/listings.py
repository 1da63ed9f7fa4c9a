"""Listings across tasks: every task, and effects of any task (what waits for a human).

``GET /v1/tasks`` lists tasks newest first, filtered by state (leased, free, waiting, done)
and by the worker of their lease; ``GET /v1/effects`` lists effects of every task newest
first, filtered by state, task and rule - ``?state=unknown`` is what waits for a human.
Both are cursor-paginated (:mod:`sidecar.control.pages`) and built off the event loop.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime

from aiohttp import web

from sidecar.control.endpoints import STORE_PROBLEMS, Api
from sidecar.control.keys import CLOCK, STORE
from sidecar.control.pages import cut, json_body, page_request, position
from sidecar.control.schemas import EffectPage, TaskPage, TaskSummary, with_trails
from sidecar.domain.ids import TASK_PATTERN
from sidecar.domain.model import Effect, EffectEvent, EffectState, TaskView
from sidecar.errors import InvalidRequest
from sidecar.store.base import TASK_STATES, EffectFilter, TaskFilter
from sidecar.store.rows import to_us

api = Api("listings")
_EFFECT_STATES = tuple(s.value for s in EffectState)
_MAX_FILTER = 256
_TASK = re.compile(TASK_PATTERN)


def _choice(request: web.Request, name: str, allowed: tuple[str, ...]) -> str | None:
    value = request.query.get(name)
    if value is not None and value not in allowed:
        raise InvalidRequest(f"{name} must be one of {', '.join(allowed)}, got {value[:64]!r}")
    return value


def _text(request: web.Request, name: str) -> str | None:
    value = request.query.get(name)
    if value is not None and not 0 < len(value) <= _MAX_FILTER:
        raise InvalidRequest(f"{name} must be 1 to {_MAX_FILTER} characters")
    return value


def _task_page(views: list[TaskView], limit: int, now: datetime) -> bytes:
    page, cursor = cut(views, limit, "tasks", lambda v: [to_us(v.state.created_at), v.state.task])
    answer = TaskPage(tasks=[TaskSummary.of(v, now) for v in page], next_cursor=cursor)
    return answer.model_dump_json().encode()


@api.route(
    "GET",
    "/v1/tasks",
    summary="Tasks, newest first, a page at a time; ?state=leased|free|waiting|done, ?worker=.",
    answer=TaskPage,
    problems=STORE_PROBLEMS,
    paginated=True,
)
async def list_tasks(request: web.Request) -> web.Response:
    asked = page_request(request, "tasks")
    where = TaskFilter(_choice(request, "state", TASK_STATES), _text(request, "worker"))
    after = position(asked, 1)
    now = request.app[CLOCK].now()
    views = await request.app[STORE].tasks_page(where, after, asked.limit + 1, now)
    body = await asyncio.to_thread(_task_page, views, asked.limit, now)
    return json_body(body)


def _effect_page(found: list[Effect], events: list[EffectEvent], limit: int) -> bytes:
    page, cursor = cut(found, limit, "all-effects", lambda e: [to_us(e.created_at), e.task, e.key])
    answer = EffectPage(effects=with_trails(page, events), next_cursor=cursor)
    return answer.model_dump_json().encode()


@api.route(
    "GET",
    "/v1/effects",
    summary=(
        "Effects of every task, newest first, a page at a time; ?state= (unknown: what "
        "waits for a human), ?task=, ?rule=."
    ),
    answer=EffectPage,
    problems=STORE_PROBLEMS,
    paginated=True,
)
async def list_effects(request: web.Request) -> web.Response:
    asked = page_request(request, "all-effects")
    task = _text(request, "task")
    if task is not None and not _TASK.fullmatch(task):
        raise InvalidRequest(f"invalid task id {task[:64]!r}")
    where = EffectFilter(_choice(request, "state", _EFFECT_STATES), task, _text(request, "rule"))
    after = position(asked, 2)
    store = request.app[STORE]
    found = await store.effects_across(where, after, asked.limit + 1)
    events = await store.effect_events_of([(e.task, e.key) for e in found[: asked.limit]])
    body = await asyncio.to_thread(_effect_page, found, events, asked.limit)
    return json_body(body)
