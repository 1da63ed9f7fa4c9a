"""Issues, issue comments and labels of the GitHub emulator.

Pull requests are issues too: every route here that takes an issue number also takes a
pull request's (``GET /issues/{n}`` answers it with a ``pull_request`` member, comments
on a pull request are issue comments).
"""

from __future__ import annotations

from aiohttp import web

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import (
    Json,
    Urls,
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
)
from sidecar.emulators.github.gitdata import GitRepo
from sidecar.emulators.github.labels import add_labels, label_names
from sidecar.emulators.github.pullstate import change_state
from sidecar.emulators.github.state import (
    AUTHENTICATED_USER,
    Comment,
    Issue,
    Repository,
    now,
)

routes = web.RouteTableDef()

ISSUES = "/repos/{owner}/{repo}/issues"
ISSUE = ISSUES + r"/{number:\d+}"
COMMENT = ISSUES + r"/comments/{id:\d+}"


def issue_shape(urls: Urls, repo: Repository, issue: Issue) -> Json:
    api = f"{urls.repo(repo)}/issues/{issue.number}"
    page = "pull" if issue.pull else "issues"
    found: Json = {
        "url": api,
        "repository_url": urls.repo(repo),
        "labels_url": f"{api}/labels{{/name}}",
        "comments_url": f"{api}/comments",
        "events_url": f"{api}/events",
        "html_url": f"{urls.repo_web(repo)}/{page}/{issue.number}",
        "id": issue.id,
        "node_id": shapes.node_id("I", issue.id),
        "number": issue.number,
        "title": issue.title,
        "user": shapes.user(urls, issue.user),
        "labels": shapes.issue_labels(urls, repo, issue),
        "state": issue.state,
        "state_reason": "completed" if issue.state == "closed" and not issue.pull else None,
        "locked": False,
        "assignee": None,
        "assignees": [],
        "milestone": None,
        "comments": sum(1 for c in repo.comments if c.issue_number == issue.number),
        "created_at": issue.created_at,
        "updated_at": issue.updated_at,
        "closed_at": issue.closed_at,
        "author_association": "OWNER",
        "active_lock_reason": None,
        "body": issue.body,
    }
    if issue.pull is not None:
        pr = f"{urls.repo_web(repo)}/pull/{issue.number}"
        found["draft"] = issue.pull.draft
        found["pull_request"] = {
            "url": f"{urls.repo(repo)}/pulls/{issue.number}",
            "html_url": pr,
            "diff_url": f"{pr}.diff",
            "patch_url": f"{pr}.patch",
            "merged_at": issue.pull.merged_at,
        }
    return found


@routes.post(ISSUES)
async def create_issue(request: web.Request) -> web.Response:
    repo = repo_of(request)
    body = await object_body(request)
    title = text_field(body, "title", "Issue")
    if not title:
        raise missing_field("Issue", "title")
    state = state_of(request)
    stamp = now()
    issue = Issue(
        number=repo.next_number,
        id=state.next_id(),
        title=title,
        body=text_field(body, "body", "Issue"),
        user=AUTHENTICATED_USER,
        created_at=stamp,
        updated_at=stamp,
    )
    repo.next_number += 1
    repo.issues.append(issue)
    add_labels(state.next_id, repo, issue, label_names(body.get("labels") or []))
    state.save()
    found = issue_shape(urls_of(request), repo, issue)
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


@routes.get(ISSUES)
async def list_issues(request: web.Request) -> web.Response:
    repo = repo_of(request)
    wanted = request.query.get("state", "open")
    found = [i for i in repo.issues if wanted in ("all", i.state)]
    found.sort(key=lambda i: i.number, reverse=request.query.get("direction", "desc") == "desc")
    urls = urls_of(request)
    return paginate(request, [issue_shape(urls, repo, i) for i in found])


@routes.get(ISSUE)
async def get_issue(request: web.Request) -> web.Response:
    repo = repo_of(request)
    return reply(issue_shape(urls_of(request), repo, issue_of(request, repo)))


@routes.patch(ISSUE)
async def update_issue(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = issue_of(request, repo)
    body = await object_body(request)
    state = state_of(request)
    for name in ("title", "body"):
        if name in body:
            setattr(issue, name, text_field(body, name, "Issue"))
    if "labels" in body:
        issue.labels = []
        add_labels(state.next_id, repo, issue, label_names(body["labels"] or []))
    if "state" in body:
        with GitRepo(state.git_dir(repo)) as git:
            change_state(git, repo, issue, body["state"], "https://docs.github.com/rest/issues")
    issue.updated_at = now()
    state.save()
    return reply(issue_shape(urls_of(request), repo, issue))


# -- comments ------------------------------------------------------------------------------


@routes.post(ISSUE + "/comments")
async def create_comment(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = issue_of(request, repo)
    body = await object_body(request)
    text = text_field(body, "body", "IssueComment")
    if not text:
        raise missing_field("IssueComment", "body")
    state = state_of(request)
    stamp = now()
    comment = Comment(state.next_id(), issue.number, text, AUTHENTICATED_USER, stamp, stamp)
    repo.comments.append(comment)
    issue.updated_at = stamp
    state.save()
    found = shapes.comment(urls_of(request), repo, comment, issue.pull is not None)
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


def _comments(request: web.Request, repo: Repository, number: int | None) -> web.Response:
    since = request.query.get("since", "")
    found = [
        c
        for c in repo.comments
        if (number is None or c.issue_number == number) and c.updated_at >= since
    ]
    urls = urls_of(request)
    return paginate(
        request,
        [shapes.comment(urls, repo, c, _is_pull(repo, c.issue_number)) for c in found],
    )


def _is_pull(repo: Repository, number: int) -> bool:
    issue = repo.issue(number)
    return issue is not None and issue.pull is not None


@routes.get(ISSUE + "/comments")
async def list_comments(request: web.Request) -> web.Response:
    repo = repo_of(request)
    return _comments(request, repo, issue_of(request, repo).number)


@routes.get(ISSUES + "/comments")
async def list_repo_comments(request: web.Request) -> web.Response:
    return _comments(request, repo_of(request), None)


def _comment_of(request: web.Request, repo: Repository) -> Comment:
    wanted = int(request.match_info["id"])
    found = next((c for c in repo.comments if c.id == wanted), None)
    if found is None:
        raise not_found()
    return found


@routes.get(COMMENT)
async def get_comment(request: web.Request) -> web.Response:
    repo = repo_of(request)
    found = _comment_of(request, repo)
    return reply(shapes.comment(urls_of(request), repo, found, _is_pull(repo, found.issue_number)))


@routes.patch(COMMENT)
async def update_comment(request: web.Request) -> web.Response:
    repo = repo_of(request)
    found = _comment_of(request, repo)
    text = text_field(await object_body(request), "body", "IssueComment")
    if not text:
        raise missing_field("IssueComment", "body")
    found.body, found.updated_at = text, now()
    state_of(request).save()
    return reply(shapes.comment(urls_of(request), repo, found, _is_pull(repo, found.issue_number)))


@routes.delete(COMMENT)
async def delete_comment(request: web.Request) -> web.Response:
    repo = repo_of(request)
    repo.comments.remove(_comment_of(request, repo))
    state_of(request).save()
    return web.Response(status=204)
