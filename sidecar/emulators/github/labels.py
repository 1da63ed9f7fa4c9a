"""Labels of the GitHub emulator: the repository's set and each issue's.

Putting a label the repository lacks on an issue (or pull request) creates it with
GitHub's default colour, as GitHub does; label names are unique regardless of case.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from aiohttp import web

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import (
    ApiError,
    body_of,
    issue_of,
    missing_field,
    not_found,
    object_body,
    paginate,
    reply,
    repo_of,
    state_of,
    text_field,
    urls_of,
    validation_failed,
)
from sidecar.emulators.github.state import Issue, Label, Repository, now

routes = web.RouteTableDef()

LABELS = "/repos/{owner}/{repo}/labels"
ISSUE_LABELS = r"/repos/{owner}/{repo}/issues/{number:\d+}/labels"
DEFAULT_COLOR = "ededed"  # what GitHub gives a label created implicitly
DOCS = "https://docs.github.com/rest/issues/labels"


def _color(raw: object) -> str:
    color = (raw if isinstance(raw, str) else DEFAULT_COLOR).removeprefix("#").lower()
    if not re.fullmatch(r"[0-9a-f]{6}", color):
        raise validation_failed(
            {"resource": "Label", "code": "invalid", "field": "color"},
            documentation_url=DOCS,
        )
    return color


@routes.post(LABELS)
async def create_label(request: web.Request) -> web.Response:
    repo = repo_of(request)
    body = await object_body(request)
    name = text_field(body, "name", "Label")
    if not name:
        raise missing_field("Label", "name", DOCS)
    if repo.label(name) is not None:
        raise validation_failed(
            {"resource": "Label", "code": "already_exists", "field": "name"},
            documentation_url=DOCS,
        )
    state = state_of(request)
    label = Label(
        state.next_id(), name, _color(body.get("color")), text_field(body, "description", "Label")
    )
    repo.labels.append(label)
    state.save()
    found = shapes.label(urls_of(request), repo, label)
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


@routes.get(LABELS)
async def list_labels(request: web.Request) -> web.Response:
    repo = repo_of(request)
    urls = urls_of(request)
    return paginate(request, [shapes.label(urls, repo, lb) for lb in repo.labels])


@routes.get(LABELS + "/{name}")
async def get_label(request: web.Request) -> web.Response:
    repo = repo_of(request)
    found = repo.label(request.match_info["name"])
    if found is None:
        raise not_found()
    return reply(shapes.label(urls_of(request), repo, found))


def label_names(raw: object) -> list[str]:
    """Label names from a body: a bare list or ``{"labels": [...]}``, of names or
    ``{"name": ...}`` objects (GitHub accepts all four)."""
    if isinstance(raw, dict):
        raw = raw.get("labels", [])
    if not isinstance(raw, list):
        raise ApiError(422, "Invalid request.\n\nFor 'labels', expected an array.")
    names = []
    for item in raw:
        name = item.get("name") if isinstance(item, dict) else item
        if not isinstance(name, str) or not name:
            raise validation_failed({"resource": "Label", "code": "invalid", "field": "name"})
        names.append(name)
    return names


def add_labels(
    next_id: Callable[[], int], repo: Repository, issue: Issue, names: list[str]
) -> None:
    """Put labels on an issue, creating the ones the repository lacks (as GitHub does)."""
    for name in names:
        label = repo.label(name)
        if label is None:
            label = Label(next_id(), name, DEFAULT_COLOR, None)
            repo.labels.append(label)
        if label.name not in issue.labels:
            issue.labels.append(label.name)


async def _set_labels(request: web.Request, *, replace: bool) -> web.Response:
    repo = repo_of(request)
    issue = issue_of(request, repo)
    names = label_names(await body_of(request) or [])
    state = state_of(request)
    if replace:
        issue.labels = []
    add_labels(state.next_id, repo, issue, names)
    issue.updated_at = now()
    state.save()
    return reply(shapes.issue_labels(urls_of(request), repo, issue))


@routes.post(ISSUE_LABELS)
async def add_issue_labels(request: web.Request) -> web.Response:
    return await _set_labels(request, replace=False)


@routes.put(ISSUE_LABELS)
async def set_issue_labels(request: web.Request) -> web.Response:
    return await _set_labels(request, replace=True)


@routes.get(ISSUE_LABELS)
async def list_issue_labels(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = issue_of(request, repo)
    return paginate(request, shapes.issue_labels(urls_of(request), repo, issue))


@routes.delete(ISSUE_LABELS + "/{name}")
async def remove_issue_label(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = issue_of(request, repo)
    label = repo.label(request.match_info["name"])
    if label is None or label.name not in issue.labels:
        raise ApiError(404, "Label does not exist", documentation_url=DOCS)
    issue.labels.remove(label.name)
    state_of(request).save()
    return reply(shapes.issue_labels(urls_of(request), repo, issue))
