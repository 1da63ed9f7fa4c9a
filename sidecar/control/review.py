"""Routes of ``sidecar review`` against a running sidecar.

``GET /v1/review?since=30d`` answers the window's figures (:mod:`sidecar.review.figures`),
read from the store a page at a time (:mod:`sidecar.review.collect`); it writes nothing,
so the review's own measurements in it are null - the CLI makes them through the claim,
release and checkpoint routes.  ``GET /v1/review/report?since=`` answers the same figures
as the HTML report ``sidecar review --out`` writes (inline SVG charts, no script): the
console shows it.  ``DELETE /v1/review/scratch/{task}`` removes the CLI's
scratch task afterwards; it deletes nothing but tasks named as the review names them
(:data:`sidecar.review.SCRATCH_PREFIX`), and only once no lease on one is live.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from sidecar.cli.durations import duration
from sidecar.control.endpoints import STORE_PROBLEMS, Api, json_answer, task_param
from sidecar.control.keys import CLOCK, STORE
from sidecar.errors import InvalidRequest
from sidecar.review import SCRATCH_PREFIX

if TYPE_CHECKING:
    from sidecar.review.figures import Review

api = Api("review")
DEFAULT_SINCE = "30d"


class ScratchRemoved(BaseModel):
    model_config = ConfigDict(frozen=True)

    task: str
    deleted: bool
    #: why it was kept, when it was (e.g. its lease is live).
    kept: str | None


@api.route(
    "GET",
    "/v1/review",
    summary="The monthly review's figures since ?since= (a duration: 30d, 12h, 90m; "
    "default 30d): replays, what waited for a human, uncovered writes, refused stale "
    "writes, stage durations against the lease. Read-only.",
    answer="sidecar.review.figures:Review",
    problems=STORE_PROBLEMS,
)
async def review(request: web.Request) -> web.Response:
    return json_answer(await _figures(request))


async def _figures(request: web.Request) -> Review:
    given = request.query.get("since", DEFAULT_SINCE)
    try:
        back = duration(given[:32])
    except argparse.ArgumentTypeError as exc:
        raise InvalidRequest(f"since must be a duration such as 30d, 12h or 90m: {exc}") from exc
    if back > timedelta(days=3660):
        raise InvalidRequest("since must be at most 3660d")
    # The review's modules load with the first review asked for, not with every sidecar.
    from sidecar.review.collect import collect  # noqa: PLC0415

    now = request.app[CLOCK].now()
    return await collect(request.app[STORE], now - back, now, source=str(request.url.origin()))


@api.route(
    "GET",
    "/v1/review/report",
    summary="The review since ?since= as the self-contained HTML report of `sidecar review "
    "--out` (inline SVG charts, no script). Read-only: the fencing proof is not run.",
    content_type="text/html",
    problems=STORE_PROBLEMS,
)
async def review_report(request: web.Request) -> web.Response:
    figures = await _figures(request)
    # The charts (pygal) load with the first report asked for, not with every sidecar.
    from sidecar.review import report_html  # noqa: PLC0415

    # pygal draws in Python: off the event loop the proxy shares.
    html = await asyncio.to_thread(report_html.render, figures)
    return web.Response(text=html, content_type="text/html")


@api.route(
    "DELETE",
    "/v1/review/scratch/{task}",
    summary="Delete a scratch task of `sidecar review`'s fencing proof (only tasks named "
    f"{SCRATCH_PREFIX}...; kept while its lease is live).",
    answer=ScratchRemoved,
    problems=STORE_PROBLEMS,
)
async def remove_scratch(request: web.Request) -> web.Response:
    task = task_param(request)
    if not task.startswith(SCRATCH_PREFIX):
        raise InvalidRequest(f"only the review's scratch tasks ({SCRATCH_PREFIX}...) go here")
    # A cutoff ahead of now: the scratch task was just written and is to go at once.
    cutoff = request.app[CLOCK].now() + timedelta(hours=1)
    found = await request.app[STORE].prune_task(task, cutoff)
    return json_answer(ScratchRemoved(task=task, deleted=found.deleted, kept=found.kept))
