"""The JSON objects the GitHub emulator answers with, in GitHub's documented shapes.

Only shapes shared by several routes live here (users, repositories, refs, commits,
labels, comments, releases, contents); pull requests and issues are built next to
their routes.  Every URL comes from ``Urls`` so the objects name the emulator's public
address, never a hard-coded host.
"""

from __future__ import annotations

import base64
import stat
import zlib
from datetime import UTC, datetime
from urllib.parse import quote, urlparse

from dulwich.objects import Blob, Commit, ShaFile

from sidecar.emulators.github.api import Json, Urls
from sidecar.emulators.github.state import Comment, Issue, Label, Release, Repository

UNSIGNED = {"verified": False, "reason": "unsigned", "signature": None, "payload": None}


def node_id(kind: str, number: int) -> str:
    """An opaque global id in GitHub's style (``PR_kwDO...``); clients never parse it."""
    raw = base64.urlsafe_b64encode(number.to_bytes(8, "big")).decode().rstrip("=")
    return f"{kind}_kwDO{raw}"


def user_id(login: str) -> int:
    # Users are not stored: every login has one stable id derived from its name.
    return 1_000_000 + zlib.crc32(login.lower().encode()) % 1_000_000_000


def user(urls: Urls, login: str, kind: str = "User") -> Json:
    api = f"{urls.api}/users/{login}"
    return {
        "login": login,
        "id": user_id(login),
        "node_id": node_id("U" if kind == "User" else "O", user_id(login)),
        "avatar_url": f"{urls.web}/{login}.png",
        "gravatar_id": "",
        "url": api,
        "html_url": f"{urls.web}/{login}",
        "followers_url": f"{api}/followers",
        "following_url": f"{api}/following{{/other_user}}",
        "gists_url": f"{api}/gists{{/gist_id}}",
        "starred_url": f"{api}/starred{{/owner}}{{/repo}}",
        "subscriptions_url": f"{api}/subscriptions",
        "organizations_url": f"{api}/orgs",
        "repos_url": f"{api}/repos",
        "events_url": f"{api}/events{{/privacy}}",
        "received_events_url": f"{api}/received_events",
        "type": kind,
        "user_view_type": "public",
        "site_admin": False,
    }


def repository(urls: Urls, repo: Repository) -> Json:
    api, web = urls.repo(repo), urls.repo_web(repo)
    host = urlparse(urls.web).netloc
    open_issues = sum(1 for i in repo.issues if i.state == "open")
    return {
        "id": repo.id,
        "node_id": node_id("R", repo.id),
        "name": repo.name,
        "full_name": repo.full_name,
        "private": repo.private,
        "owner": user(urls, repo.owner, repo.owner_type),
        "html_url": web,
        "description": repo.description,
        "fork": False,
        "url": api,
        "branches_url": f"{api}/branches{{/branch}}",
        "comments_url": f"{api}/comments{{/number}}",
        "commits_url": f"{api}/commits{{/sha}}",
        "contents_url": f"{api}/contents/{{+path}}",
        "git_commits_url": f"{api}/git/commits{{/sha}}",
        "git_refs_url": f"{api}/git/refs{{/sha}}",
        "issue_comment_url": f"{api}/issues/comments{{/number}}",
        "issues_url": f"{api}/issues{{/number}}",
        "labels_url": f"{api}/labels{{/name}}",
        "pulls_url": f"{api}/pulls{{/number}}",
        "releases_url": f"{api}/releases{{/id}}",
        "created_at": repo.created_at,
        "updated_at": repo.updated_at,
        "pushed_at": repo.updated_at,
        "git_url": f"git://{host}/{repo.full_name}.git",
        "ssh_url": f"git@{host}:{repo.full_name}.git",
        "clone_url": f"{web}.git",
        "svn_url": web,
        "homepage": None,
        "size": 0,
        "stargazers_count": 0,
        "watchers_count": 0,
        "language": None,
        "has_issues": True,
        "has_projects": True,
        "has_downloads": True,
        "has_wiki": True,
        "has_pages": False,
        "has_discussions": False,
        "forks_count": 0,
        "mirror_url": None,
        "archived": False,
        "disabled": False,
        "open_issues_count": open_issues,
        "license": None,
        "allow_forking": True,
        "is_template": False,
        "web_commit_signoff_required": False,
        "topics": [],
        "visibility": "private" if repo.private else "public",
        "forks": 0,
        "open_issues": open_issues,
        "watchers": 0,
        "default_branch": repo.default_branch,
        "permissions": {
            "admin": True,
            "maintain": True,
            "push": True,
            "triage": True,
            "pull": True,
        },
        "allow_squash_merge": True,
        "allow_merge_commit": True,
        "allow_rebase_merge": True,
        "allow_auto_merge": False,
        "delete_branch_on_merge": False,
    }


def git_ref(urls: Urls, repo: Repository, name: str, sha: str, kind: str) -> Json:
    api = urls.repo(repo)
    plural = "tags" if kind == "tag" else f"{kind}s"
    return {
        "ref": name,
        "node_id": node_id("REF", zlib.crc32(f"{repo.id}:{name}".encode())),
        "url": f"{api}/git/{quote(name)}",
        "object": {"sha": sha, "type": kind, "url": f"{api}/git/{plural}/{sha}"},
    }


def identity(raw: bytes, when: int, offset: int) -> Json:
    name, _, email = raw.decode(errors="replace").partition(" <")
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"name": name, "email": email.rstrip(">"), "date": stamp}


def _parents(urls: Urls, repo: Repository, commit: Commit) -> list[Json]:
    return [
        {
            "sha": p.decode(),
            "url": f"{urls.repo(repo)}/commits/{p.decode()}",
            "html_url": f"{urls.repo_web(repo)}/commit/{p.decode()}",
        }
        for p in commit.parents
    ]


def git_commit(urls: Urls, repo: Repository, commit: Commit) -> Json:
    """A commit as the Git database API shows it (``/git/commits/{sha}``)."""
    sha, api = commit.id.decode(), urls.repo(repo)
    return {
        "sha": sha,
        "node_id": node_id("C", zlib.crc32(commit.id)),
        "url": f"{api}/git/commits/{sha}",
        "html_url": f"{urls.repo_web(repo)}/commit/{sha}",
        "author": identity(commit.author, commit.author_time, commit.author_timezone),
        "committer": identity(commit.committer, commit.commit_time, commit.commit_timezone),
        "tree": {"sha": commit.tree.decode(), "url": f"{api}/git/trees/{commit.tree.decode()}"},
        "message": commit.message.decode(errors="replace").removesuffix("\n"),
        "parents": _parents(urls, repo, commit),
        "verification": UNSIGNED,
    }


def commit(urls: Urls, repo: Repository, commit: Commit) -> Json:
    """A commit as the repository API shows it (``/commits/{sha}``, branch heads)."""
    sha, api = commit.id.decode(), urls.repo(repo)
    inner = git_commit(urls, repo, commit)
    return {
        "sha": sha,
        "node_id": inner["node_id"],
        "url": f"{api}/commits/{sha}",
        "html_url": inner["html_url"],
        "comments_url": f"{api}/commits/{sha}/comments",
        "commit": {
            "url": inner["url"],
            "author": inner["author"],
            "committer": inner["committer"],
            "message": inner["message"],
            "tree": inner["tree"],
            "comment_count": 0,
            "verification": UNSIGNED,
        },
        # GitHub links commit identities to accounts; the emulator knows no e-mails.
        "author": None,
        "committer": None,
        "parents": inner["parents"],
    }


def label(urls: Urls, repo: Repository, found: Label) -> Json:
    return {
        "id": found.id,
        "node_id": node_id("LA", found.id),
        "url": f"{urls.repo(repo)}/labels/{quote(found.name)}",
        "name": found.name,
        "color": found.color,
        "default": False,
        "description": found.description,
    }


def issue_labels(urls: Urls, repo: Repository, issue: Issue) -> list[Json]:
    found = (repo.label(name) for name in issue.labels)
    return [label(urls, repo, lb) for lb in found if lb is not None]


def comment(urls: Urls, repo: Repository, found: Comment, is_pull: bool) -> Json:
    page = "pull" if is_pull else "issues"
    return {
        "id": found.id,
        "node_id": node_id("IC", found.id),
        "url": f"{urls.repo(repo)}/issues/comments/{found.id}",
        "html_url": f"{urls.repo_web(repo)}/{page}/{found.issue_number}#issuecomment-{found.id}",
        "issue_url": f"{urls.repo(repo)}/issues/{found.issue_number}",
        "body": found.body,
        "user": user(urls, found.user),
        "created_at": found.created_at,
        "updated_at": found.updated_at,
        "author_association": "OWNER",
        "performed_via_github_app": None,
    }


def release(urls: Urls, repo: Repository, found: Release) -> Json:
    api = f"{urls.repo(repo)}/releases/{found.id}"
    return {
        "id": found.id,
        "node_id": node_id("RE", found.id),
        "url": api,
        "html_url": f"{urls.repo_web(repo)}/releases/tag/{quote(found.tag_name)}",
        "assets_url": f"{api}/assets",
        "upload_url": f"{api}/assets{{?name,label}}",
        "tarball_url": f"{urls.repo(repo)}/tarball/{quote(found.tag_name)}",
        "zipball_url": f"{urls.repo(repo)}/zipball/{quote(found.tag_name)}",
        "tag_name": found.tag_name,
        "target_commitish": found.target_commitish,
        "name": found.name,
        "body": found.body,
        "draft": found.draft,
        "prerelease": found.prerelease,
        "created_at": found.created_at,
        "published_at": found.published_at,
        "author": user(urls, found.author),
        "assets": [],
    }


def content(
    urls: Urls, repo: Repository, path: str, ref: str, mode: int, obj: ShaFile, *, body: bool
) -> Json:
    """A contents-API entry: a file (with base64 ``content`` when ``body``), dir or symlink."""
    api, web = urls.repo(repo), urls.repo_web(repo)
    sha = obj.id.decode()
    kind = "dir" if stat.S_ISDIR(mode) else "symlink" if stat.S_ISLNK(mode) else "file"
    data = obj.as_raw_string() if isinstance(obj, Blob) else b""
    plural = "trees" if kind == "dir" else "blobs"
    self_url = f"{api}/contents/{quote(path)}?ref={quote(ref)}"
    html = f"{web}/{'tree' if kind == 'dir' else 'blob'}/{quote(ref)}/{quote(path)}"
    found: Json = {
        "type": kind,
        "size": len(data),
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "sha": sha,
        "url": self_url,
        "git_url": f"{api}/git/{plural}/{sha}",
        "html_url": html,
        "download_url": None if kind == "dir" else f"{web}/raw/{quote(ref)}/{quote(path)}",
        "_links": {"self": self_url, "git": f"{api}/git/{plural}/{sha}", "html": html},
    }
    if kind == "symlink":
        found["target"] = data.decode(errors="replace")
    if body and kind == "file":
        found["content"] = base64.encodebytes(data).decode()
        found["encoding"] = "base64"
    return found
