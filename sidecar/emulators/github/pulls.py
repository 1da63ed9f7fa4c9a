"""Pull requests in the GitHub emulator: create, list, read, edit, merge.

A pull request is an issue with a ``pull`` record (they share one number sequence); its
shape and state changes are in ``pullstate``.  Merging makes a real merge with dulwich:
a merge commit whose parents are [base, head] and whose tree is git's three-way merge of
the two (exactly head's tree when base is an ancestor of head); conflicts make it "not
mergeable" (405).  ``squash`` makes one commit on base with that tree; ``rebase`` only
fast-forwards (base an ancestor of head) and is refused otherwise.
"""

from __future__ import annotations

from aiohttp import web

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import (
    ApiError,
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
from sidecar.emulators.github.gitdata import GitRepo
from sidecar.emulators.github.pullstate import (
    already_exists,
    change_state,
    live_shas,
    open_duplicate,
    pull_shape,
)
from sidecar.emulators.github.state import AUTHENTICATED_USER, Issue, Pull, Repository, now

routes = web.RouteTableDef()

PULLS = "/repos/{owner}/{repo}/pulls"
PULL = PULLS + r"/{number:\d+}"
CREATE_DOCS = "https://docs.github.com/rest/pulls/pulls#create-a-pull-request"
UPDATE_DOCS = "https://docs.github.com/rest/pulls/pulls#update-a-pull-request"
MERGE_DOCS = "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request"


def _pull_of(request: web.Request, repo: Repository) -> Issue:
    issue = repo.issue(int(request.match_info["number"]))
    if issue is None or issue.pull is None:
        raise not_found()
    return issue


@routes.post(PULLS)
async def create_pull(request: web.Request) -> web.Response:
    repo = repo_of(request)
    body = await object_body(request)
    title = text_field(body, "title", "PullRequest")
    head = text_field(body, "head", "PullRequest")
    base = text_field(body, "base", "PullRequest")
    for name, value in (("title", title), ("head", head), ("base", base)):
        if not value:
            raise missing_field("PullRequest", name, CREATE_DOCS)
    assert title
    assert head
    assert base
    # ``owner:branch`` names a branch of that owner's repository; there are no forks here,
    # so only this repository's owner can be named.
    head_owner, _, head_ref = head.rpartition(":")
    state = state_of(request)
    with GitRepo(state.git_dir(repo)) as git:
        branches = git.branches()
        invalid = []
        if base not in branches:
            invalid.append({"resource": "PullRequest", "field": "base", "code": "invalid"})
        if head_ref not in branches or (head_owner and head_owner.lower() != repo.owner.lower()):
            invalid.append({"resource": "PullRequest", "field": "head", "code": "invalid"})
        if invalid:
            raise validation_failed(*invalid, documentation_url=CREATE_DOCS)
        if open_duplicate(repo, head_ref, base):
            raise already_exists(repo, head_ref, CREATE_DOCS)
        if not git.commits_between(branches[base], branches[head_ref]):
            raise validation_failed(
                {
                    "resource": "PullRequest",
                    "code": "custom",
                    "message": f"No commits between {base} and {head}",
                },
                documentation_url=CREATE_DOCS,
            )
        stamp = now()
        issue = Issue(
            number=repo.next_number,
            id=state.next_id(),
            title=title,
            body=text_field(body, "body", "PullRequest"),
            user=AUTHENTICATED_USER,
            created_at=stamp,
            updated_at=stamp,
            pull=Pull(
                id=state.next_id(),
                head_ref=head_ref,
                head_sha=branches[head_ref],
                base_ref=base,
                base_sha=branches[base],
                draft=bool(body.get("draft", False)),
                maintainer_can_modify=bool(body.get("maintainer_can_modify", False)),
            ),
        )
        repo.next_number += 1
        repo.issues.append(issue)
        state.save()
        found = pull_shape(urls_of(request), repo, issue, git, full=True)
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


@routes.get(PULLS)
async def list_pulls(request: web.Request) -> web.Response:
    repo = repo_of(request)
    query = request.query
    wanted_state = query.get("state", "open")
    pulls = [i for i in repo.pulls() if wanted_state in ("all", i.state)]
    if base := query.get("base"):
        pulls = [i for i in pulls if i.pull is not None and i.pull.base_ref == base]
    head_owner, colon, head_ref = query.get("head", "").partition(":")
    # GitHub ignores a ``head`` filter without the ``owner:`` prefix (a bare branch name
    # filters nothing, a well-known trap); with it, owner and branch must both match.
    if colon:
        pulls = [
            i
            for i in pulls
            if i.pull is not None
            and i.pull.head_ref == head_ref
            and head_owner.lower() == repo.owner.lower()
        ]
    sort = query.get("sort", "created")
    if sort == "updated":
        pulls.sort(key=lambda i: (i.updated_at, i.number))
    elif sort == "popularity":
        counts = {
            i.number: sum(1 for c in repo.comments if c.issue_number == i.number) for i in pulls
        }
        pulls.sort(key=lambda i: (counts[i.number], i.number))
    else:  # created, long-running
        pulls.sort(key=lambda i: i.number)
    default_direction = "desc" if sort == "created" else "asc"
    if query.get("direction", default_direction) == "desc":
        pulls.reverse()
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        return paginate(request, [pull_shape(urls, repo, i, git, full=False) for i in pulls])


@routes.get(PULL)
async def get_pull(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = _pull_of(request, repo)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        return reply(pull_shape(urls_of(request), repo, issue, git, full=True))


@routes.get(PULL + "/commits")
async def list_pull_commits(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = _pull_of(request, repo)
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        head, base = live_shas(git, issue)
        commits = git.commits_between(base, head)
        return paginate(request, [shapes.commit(urls, repo, c) for c in commits])


@routes.patch(PULL)
async def update_pull(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = _pull_of(request, repo)
    pull = issue.pull
    assert pull is not None
    body = await object_body(request)
    state = state_of(request)
    with GitRepo(state.git_dir(repo)) as git:
        if (base := text_field(body, "base", "PullRequest")) is not None:
            if base not in git.branches():
                raise validation_failed(
                    {"resource": "PullRequest", "field": "base", "code": "invalid"},
                    documentation_url=UPDATE_DOCS,
                )
            pull.base_ref = base
        for name in ("title", "body"):
            if name in body:
                setattr(issue, name, text_field(body, name, "PullRequest"))
        if "maintainer_can_modify" in body:
            pull.maintainer_can_modify = bool(body["maintainer_can_modify"])
        if "state" in body:
            change_state(git, repo, issue, body["state"], UPDATE_DOCS)
        issue.updated_at = now()
        state.save()
        return reply(pull_shape(urls_of(request), repo, issue, git, full=True))


@routes.get(PULL + "/merge")
async def is_merged(request: web.Request) -> web.Response:
    issue = _pull_of(request, repo_of(request))
    if issue.pull is None or not issue.pull.merged:
        raise not_found()
    return web.Response(status=204)


@routes.put(PULL + "/merge")
async def merge_pull(request: web.Request) -> web.Response:
    repo = repo_of(request)
    issue = _pull_of(request, repo)
    pull = issue.pull
    assert pull is not None
    body = await object_body(request)
    method = body.get("merge_method", "merge")
    if method not in ("merge", "squash", "rebase"):
        raise validation_failed(
            {"resource": "PullRequest", "field": "merge_method", "code": "invalid"},
            documentation_url=MERGE_DOCS,
        )
    state = state_of(request)
    with GitRepo(state.git_dir(repo)) as git:
        head, base = live_shas(git, issue)
        if issue.state != "open" or git.ref(f"refs/heads/{pull.head_ref}") is None:
            raise ApiError(405, "Pull Request is not mergeable", documentation_url=MERGE_DOCS)
        if pull.draft:
            raise ApiError(405, "Pull Request is still a draft", documentation_url=MERGE_DOCS)
        if (expected := body.get("sha")) and expected != head:
            raise ApiError(
                409,
                "Head branch was modified. Review and try the merge again.",
                documentation_url=MERGE_DOCS,
            )
        tree = git.merged_tree(base, head)
        if tree is None:
            raise ApiError(405, "Pull Request is not mergeable", documentation_url=MERGE_DOCS)
        title = text_field(body, "commit_title", "PullRequest")
        detail = text_field(body, "commit_message", "PullRequest")
        if method == "rebase":
            if not git.is_ancestor(base, head):
                raise ApiError(405, "This branch can't be rebased", documentation_url=MERGE_DOCS)
            sha = head
        elif method == "squash":
            listed = "\n".join(
                f"* {c.message.decode().strip()}" for c in git.commits_between(base, head)
            )
            message = f"{title or f'{issue.title} (#{issue.number})'}\n\n{detail or listed}"
            sha = git.new_commit(tree, [base], message)
        else:
            default_title = f"Merge pull request #{issue.number} from {repo.owner}/{pull.head_ref}"
            message = f"{title or default_title}\n\n{detail if detail is not None else issue.title}"
            sha = git.new_commit(tree, [base, head], message)
        if not git.update_ref(f"refs/heads/{pull.base_ref}", base, sha):
            raise ApiError(
                405,
                "Base branch was modified. Review and try the merge again.",
                documentation_url=MERGE_DOCS,
            )
        pull.head_sha, pull.base_sha = head, base
        stamp = now()
        issue.state, issue.closed_at, issue.updated_at = "closed", stamp, stamp
        pull.merged, pull.merged_at, pull.merged_by = True, stamp, AUTHENTICATED_USER
        pull.merge_commit_sha = sha
        state.save()
    return reply({"sha": sha, "merged": True, "message": "Pull Request successfully merged"})
