"""The GitHub emulator's aiohttp application: every route, mounted twice for the REST API
(at ``/`` as on api.github.com, and under ``/api/v3`` as on GitHub Enterprise, the form
some clients are configured with) and once for git smart HTTP.

``GET /_emulator/state`` is not GitHub's: it is a stable JSON summary of everything the
emulator holds, for tests and the demo to check the outside world in one request.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from sidecar.emulators.faults import Late, late_middleware
from sidecar.emulators.github import contents, git_http, issues, labels, pulls, releases, repos
from sidecar.emulators.github.api import (
    ENTERPRISE_PREFIX,
    STATE,
    URLS,
    Json,
    Urls,
    github_middleware,
    reply,
    state_of,
)
from sidecar.emulators.github.gitdata import GitRepo
from sidecar.emulators.github.pullstate import live_shas
from sidecar.emulators.github.state import State

REST = (
    repos.routes,
    contents.routes,
    pulls.routes,
    issues.routes,
    labels.routes,
    releases.routes,
)
MAX_BODY = 100 << 20  # the contents API takes whole files, base64-encoded


def make_app(
    data_dir: Path, api_url: str, web_url: str | None = None, late: Sequence[Late] = ()
) -> web.Application:
    """The emulator over ``data_dir``; objects name ``api_url`` and ``web_url`` (default:
    ``api_url``) as the addresses clients reach it at; ``late`` injects slow answers."""
    middlewares = [late_middleware(late), github_middleware] if late else [github_middleware]
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY)
    app[STATE] = State.open(data_dir)
    app[URLS] = Urls(api=api_url.rstrip("/"), web=(web_url or api_url).rstrip("/"))
    app.router.add_get("/_emulator/state", emulator_state)
    for prefix in ("", ENTERPRISE_PREFIX):
        for table in REST:
            for route in table:
                assert isinstance(route, web.RouteDef)
                app.router.add_route(route.method, prefix + route.path, route.handler)
    app.add_routes(git_http.routes)
    return app


async def emulator_state(request: web.Request) -> web.Response:
    """Per repository (sorted by full name): branches with head commit and tree, pull
    requests by number, and how many comments, labels and releases it has."""
    state = state_of(request)
    summary: dict[str, Json] = {}
    for repo in sorted(state.repos, key=lambda r: r.full_name.lower()):
        with GitRepo(state.git_dir(repo)) as git:
            branches = {
                name: {"sha": sha, "tree": git.commit(sha).tree.decode()}
                for name, sha in git.branches().items()
            }
            tags = {
                name.removeprefix("refs/tags/"): sha for name, sha in git.refs("refs/tags/").items()
            }
            pull_requests = []
            for issue in sorted(repo.pulls(), key=lambda i: i.number):
                assert issue.pull is not None
                head_sha, base_sha = live_shas(git, issue)
                pull_requests.append(
                    {
                        "number": issue.number,
                        "title": issue.title,
                        "head": issue.pull.head_ref,
                        "head_sha": head_sha,
                        "base": issue.pull.base_ref,
                        "base_sha": base_sha,
                        "state": issue.state,
                        "merged": issue.pull.merged,
                        "merge_commit_sha": issue.pull.merge_commit_sha,
                        "labels": list(issue.labels),
                    }
                )
        summary[repo.full_name] = {
            "id": repo.id,
            "default_branch": repo.default_branch,
            "branches": branches,
            "tags": tags,
            "pulls": pull_requests,
            "issues": sum(1 for i in repo.issues if i.pull is None),
            "comments": len(repo.comments),
            "labels": len(repo.labels),
            "releases": len(repo.releases),
        }
    return reply({"repos": summary})
