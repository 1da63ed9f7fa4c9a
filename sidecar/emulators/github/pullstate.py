"""What a pull request looks like and how its state moves, for every route that shows
or changes one (``pulls`` and ``issues``).

While a pull request is open its head and base show the live branch heads, as on
GitHub; closing or merging freezes them in the record.
"""

from __future__ import annotations

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import ApiError, Json, Urls, validation_failed
from sidecar.emulators.github.gitdata import GitRepo
from sidecar.emulators.github.state import Issue, Repository, now


def live_shas(git: GitRepo, issue: Issue) -> tuple[str, str]:
    """(head sha, base sha): the branch heads while open, frozen once closed."""
    pull = issue.pull
    assert pull is not None
    if issue.state != "open":
        return pull.head_sha, pull.base_sha
    head = git.ref(f"refs/heads/{pull.head_ref}") or pull.head_sha
    base = git.ref(f"refs/heads/{pull.base_ref}") or pull.base_sha
    return head, base


def freeze(git: GitRepo, issue: Issue) -> None:
    assert issue.pull is not None
    issue.pull.head_sha, issue.pull.base_sha = live_shas(git, issue)


def pull_shape(urls: Urls, repo: Repository, issue: Issue, git: GitRepo, *, full: bool) -> Json:
    """The pull-request object; ``full`` adds what GitHub shows only for a single PR."""
    pull = issue.pull
    assert pull is not None
    api, web_url = urls.repo(repo), urls.repo_web(repo)
    n = issue.number
    head_sha, base_sha = live_shas(git, issue)
    owner = shapes.user(urls, repo.owner, repo.owner_type)
    repo_json = shapes.repository(urls, repo)

    def side(ref: str, sha: str) -> Json:
        return {
            "label": f"{repo.owner}:{ref}",
            "ref": ref,
            "sha": sha,
            "user": owner,
            "repo": repo_json,
        }

    found: Json = {
        "url": f"{api}/pulls/{n}",
        "id": pull.id,
        "node_id": shapes.node_id("PR", pull.id),
        "html_url": f"{web_url}/pull/{n}",
        "diff_url": f"{web_url}/pull/{n}.diff",
        "patch_url": f"{web_url}/pull/{n}.patch",
        "issue_url": f"{api}/issues/{n}",
        "commits_url": f"{api}/pulls/{n}/commits",
        "review_comments_url": f"{api}/pulls/{n}/comments",
        "review_comment_url": f"{api}/pulls/comments{{/number}}",
        "comments_url": f"{api}/issues/{n}/comments",
        "statuses_url": f"{api}/statuses/{head_sha}",
        "number": n,
        "state": issue.state,
        "locked": False,
        "title": issue.title,
        "user": shapes.user(urls, issue.user),
        "body": issue.body,
        "labels": shapes.issue_labels(urls, repo, issue),
        "milestone": None,
        "active_lock_reason": None,
        "created_at": issue.created_at,
        "updated_at": issue.updated_at,
        "closed_at": issue.closed_at,
        "merged_at": pull.merged_at,
        "merge_commit_sha": pull.merge_commit_sha,
        "assignee": None,
        "assignees": [],
        "requested_reviewers": [],
        "requested_teams": [],
        "head": side(pull.head_ref, head_sha),
        "base": side(pull.base_ref, base_sha),
        "_links": {
            "self": {"href": f"{api}/pulls/{n}"},
            "html": {"href": f"{web_url}/pull/{n}"},
            "issue": {"href": f"{api}/issues/{n}"},
            "comments": {"href": f"{api}/issues/{n}/comments"},
            "review_comments": {"href": f"{api}/pulls/{n}/comments"},
            "review_comment": {"href": f"{api}/pulls/comments{{/number}}"},
            "commits": {"href": f"{api}/pulls/{n}/commits"},
            "statuses": {"href": f"{api}/statuses/{head_sha}"},
        },
        "author_association": "OWNER",
        "auto_merge": None,
        "draft": pull.draft,
    }
    if not full:
        return found
    mergeable: bool | None = None
    if issue.state == "open":
        mergeable = git.merged_tree(base_sha, head_sha) is not None
    files, additions, deletions = git.diff_stats(base_sha, head_sha)
    return found | {
        "merged": pull.merged,
        "mergeable": mergeable,
        "rebaseable": mergeable and git.is_ancestor(base_sha, head_sha),
        "mergeable_state": {True: "clean", False: "dirty", None: "unknown"}[mergeable],
        "merged_by": shapes.user(urls, pull.merged_by) if pull.merged_by else None,
        "comments": sum(1 for c in repo.comments if c.issue_number == n),
        "review_comments": 0,
        "maintainer_can_modify": pull.maintainer_can_modify,
        "commits": len(git.commits_between(base_sha, head_sha)),
        "additions": additions,
        "deletions": deletions,
        "changed_files": files,
    }


def already_exists(repo: Repository, head_ref: str, docs: str) -> ApiError:
    return validation_failed(
        {
            "resource": "PullRequest",
            "code": "custom",
            "message": f"A pull request already exists for {repo.owner}:{head_ref}.",
        },
        documentation_url=docs,
    )


def open_duplicate(repo: Repository, head_ref: str, base_ref: str, but: int = 0) -> bool:
    return any(
        i.pull.head_ref == head_ref and i.pull.base_ref == base_ref
        for i in repo.pulls()
        if i.pull is not None and i.state == "open" and i.number != but
    )


def change_state(git: GitRepo, repo: Repository, issue: Issue, wanted: object, docs: str) -> None:
    """Close or reopen an issue or pull request, with GitHub's refusals.

    Closing a pull request freezes its head and base; a merged one, or one whose head
    branch is gone, cannot be reopened, nor one whose head and base another open pull
    request already has.
    """
    resource = "PullRequest" if issue.pull else "Issue"
    if wanted not in ("open", "closed"):
        raise validation_failed(
            {"resource": resource, "field": "state", "code": "invalid"}, documentation_url=docs
        )
    if wanted == issue.state:
        return
    pull = issue.pull
    if wanted == "closed":
        if pull is not None:
            freeze(git, issue)
        issue.state, issue.closed_at = "closed", now()
        return
    if pull is not None:
        if pull.merged or git.ref(f"refs/heads/{pull.head_ref}") is None:
            raise validation_failed(
                {
                    "resource": "PullRequest",
                    "code": "custom",
                    "field": "state",
                    "message": "state cannot be changed. The pull request cannot be reopened",
                },
                documentation_url=docs,
            )
        if open_duplicate(repo, pull.head_ref, pull.base_ref, but=issue.number):
            raise already_exists(repo, pull.head_ref, docs)
    issue.state, issue.closed_at = "open", None
