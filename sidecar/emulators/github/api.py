"""What every REST route of the GitHub emulator shares: errors, URLs, bodies, pages.

Errors are raised as ``ApiError`` and answered by one middleware with GitHub's body,
``{"message", "documentation_url", "status"}`` (plus ``errors`` for 422 Validation
Failed).  The same middleware refuses writes without an ``Authorization`` header, as
GitHub does, and adds the headers GitHub answers with.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from aiohttp import web
from aiohttp.web import Request
from multidict import MultiDict

from sidecar.emulators.github.state import Issue, Repository, State

DOCS = "https://docs.github.com/rest"
ENTERPRISE_PREFIX = "/api/v3"
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})

type Json = dict[str, Any]
type Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Urls:
    """Where clients reach the emulator: ``api`` for ``url`` fields, ``web`` for the rest
    (``html_url``, ``clone_url``, git smart HTTP).  Both may be public names such as
    ``https://api.github.com`` when the emulator sits behind a route."""

    api: str
    web: str

    def for_request(self, request: Request) -> Urls:
        # A client that called /api/v3/... (GitHub Enterprise form) gets links in that
        # form, so following them stays within its base URL.
        if request.path.startswith(f"{ENTERPRISE_PREFIX}/"):
            return Urls(f"{self.api}{ENTERPRISE_PREFIX}", self.web)
        return self

    def repo(self, repo: Repository) -> str:
        return f"{self.api}/repos/{repo.full_name}"

    def repo_web(self, repo: Repository) -> str:
        return f"{self.web}/{repo.full_name}"


STATE = web.AppKey("state", State)
# Handlers whose writes need no token: git smart HTTP (see the module docstring of
# git_http for why pushes are open).
_UNAUTHENTICATED: set[object] = set()


def unauthenticated(handler: Handler) -> Handler:
    _UNAUTHENTICATED.add(handler)
    return handler


URLS = web.AppKey("urls", Urls)


class ApiError(Exception):
    """An answer other than success, in GitHub's error shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        errors: Sequence[Json] | None = None,
        documentation_url: str = DOCS,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body: Json = {"message": message}
        if errors is not None:
            self.body["errors"] = list(errors)
        self.body["documentation_url"] = documentation_url
        self.body["status"] = str(status)


def not_found() -> ApiError:
    return ApiError(404, "Not Found")


def validation_failed(*errors: Json, documentation_url: str = DOCS) -> ApiError:
    return ApiError(422, "Validation Failed", errors=errors, documentation_url=documentation_url)


def missing_field(resource: str, name: str, documentation_url: str = DOCS) -> ApiError:
    return validation_failed(
        {"resource": resource, "code": "missing_field", "field": name},
        documentation_url=documentation_url,
    )


def state_of(request: web.Request) -> State:
    return request.app[STATE]


def urls_of(request: web.Request) -> Urls:
    return request.app[URLS].for_request(request)


def repo_of(request: web.Request) -> Repository:
    """The repository named by the route's ``owner`` and ``repo``; 404 if unknown."""
    found = state_of(request).repo(request.match_info["owner"], request.match_info["repo"])
    if found is None:
        raise not_found()
    return found


def issue_of(request: web.Request, repo: Repository) -> Issue:
    """The issue or pull request numbered by the route's ``number``; 404 if unknown."""
    issue = repo.issue(int(request.match_info["number"]))
    if issue is None:
        raise not_found()
    return issue


def reply(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, indent=None, separators=(",", ":"))


async def body_of(request: web.Request) -> Any:
    """The request's JSON body (None when empty); 400 as GitHub answers malformed JSON."""
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ApiError(400, "Problems parsing JSON") from None


async def object_body(request: web.Request) -> Json:
    body = await body_of(request)
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ApiError(400, "Problems parsing JSON")
    return body


def text_field(body: Json, name: str, resource: str) -> str | None:
    """An optional string member; 422 ``invalid`` if present with another type."""
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise validation_failed({"resource": resource, "code": "invalid", "field": name})
    return value


def paginate(request: web.Request, items: Sequence[Any]) -> web.Response:
    """One page of ``items`` (``per_page`` default 30, max 100) with GitHub's Link header."""
    try:
        per_page = min(max(int(request.query.get("per_page", "30")), 1), 100)
        page = max(int(request.query.get("page", "1")), 1)
    except ValueError:
        per_page, page = 30, 1
    last = max((len(items) + per_page - 1) // per_page, 1)
    response = reply(list(items[(page - 1) * per_page : page * per_page]))
    links = []

    def link(number: int, rel: str) -> str:
        query = MultiDict(request.query)
        query["per_page"] = str(per_page)
        query["page"] = str(number)
        base = f"{urls_of(request).api}{request.path.removeprefix(ENTERPRISE_PREFIX)}"
        return f'<{base}?{urlencode(list(query.items()))}>; rel="{rel}"'

    if page > 1:
        links += [link(page - 1, "prev"), link(1, "first")]
    if page < last:
        links += [link(page + 1, "next"), link(last, "last")]
    if links:
        response.headers["Link"] = ", ".join(links)
    return response


@web.middleware
async def github_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        needs_token = request.match_info.handler not in _UNAUTHENTICATED
        if request.method in WRITES and needs_token and not request.headers.get("Authorization"):
            raise ApiError(401, "Requires authentication")
        response = await handler(request)
    except ApiError as error:
        response = reply(error.body, status=error.status)
    except web.HTTPNotFound:
        response = reply(not_found().body, status=404)
    except web.HTTPMethodNotAllowed:
        # GitHub has no 405 for unknown routes: a method it does not serve is Not Found.
        response = reply(not_found().body, status=404)
    if not response.prepared:
        reset = int(time.time()) + 3600
        response.headers.update(
            {
                "X-GitHub-Media-Type": "github.v3; format=json",
                "X-GitHub-Request-Id": uuid.uuid4().hex[:20].upper(),
                "X-RateLimit-Limit": "5000",
                "X-RateLimit-Remaining": "4999",
                "X-RateLimit-Used": "1",
                "X-RateLimit-Reset": str(reset),
                "X-RateLimit-Resource": "core",
            }
        )
    return response
