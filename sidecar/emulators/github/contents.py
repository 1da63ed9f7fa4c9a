"""The contents API of the GitHub emulator: read a path, create, update or delete a file.

Each write is one commit made with dulwich (new blob, new trees along the path, a commit
whose parent is the branch head) and a compare-and-swap of the branch ref, so a
concurrent ``git push`` to the same branch makes the write fail with 409 instead of
being lost.
"""

from __future__ import annotations

import base64
import binascii
import stat

from aiohttp import web
from dulwich.objects import Tree

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import (
    ApiError,
    Json,
    not_found,
    object_body,
    reply,
    repo_of,
    state_of,
    text_field,
    urls_of,
)
from sidecar.emulators.github.gitdata import EMULATOR_IDENTITY, GitRepo
from sidecar.emulators.github.state import Repository

routes = web.RouteTableDef()

CONTENTS = "/repos/{owner}/{repo}/contents/{path:.*}"
DOCS = "https://docs.github.com/rest/repos/contents"


@routes.get("/repos/{owner}/{repo}/contents")
@routes.get(CONTENTS)
async def get_contents(request: web.Request) -> web.Response:
    repo = repo_of(request)
    path = request.match_info.get("path", "").strip("/")
    ref = request.query.get("ref") or repo.default_branch
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        if not git.refs():
            raise ApiError(404, "This repository is empty.", documentation_url=DOCS)
        head = git.resolve(ref)
        if head is None:
            raise ApiError(404, f"No commit found for the ref {ref}", documentation_url=DOCS)
        found = git.entry(head.id.decode(), path)
        if found is None:
            raise not_found()
        mode, obj = found
        if not isinstance(obj, Tree):
            return reply(shapes.content(urls, repo, path, ref, mode, obj, body=True))
        return reply(
            [
                shapes.content(urls, repo, f"{path}/{name}".lstrip("/"), ref, m, o, body=False)
                for name, m, o in git.tree_entries(obj)
            ]
        )


@routes.put(CONTENTS)
async def put_file(request: web.Request) -> web.Response:
    repo = repo_of(request)
    path = request.match_info["path"].strip("/")
    body = await object_body(request)
    message = _required(body, "message")
    try:
        data = base64.b64decode(_required(body, "content"), validate=False)
    except (binascii.Error, ValueError):
        raise ApiError(422, "content is not valid Base64", documentation_url=DOCS) from None
    return _commit(request, repo, path, body, message, data)


@routes.delete(CONTENTS)
async def delete_file(request: web.Request) -> web.Response:
    repo = repo_of(request)
    path = request.match_info["path"].strip("/")
    body = await object_body(request)
    message = _required(body, "message")
    _required(body, "sha")
    return _commit(request, repo, path, body, message, None)


def _required(body: Json, name: str) -> str:
    value = text_field(body, name, "Content")
    if value is None:
        raise ApiError(
            422, f'Invalid request.\n\n"{name}" wasn\'t supplied.', documentation_url=DOCS
        )
    return value


def _commit(
    request: web.Request,
    repo: Repository,
    path: str,
    body: Json,
    message: str,
    data: bytes | None,
) -> web.Response:
    """Commit ``data`` at ``path`` (None deletes it) on the body's branch; answer as GitHub."""
    if not path:
        raise not_found()
    branch = text_field(body, "branch", "Content") or repo.default_branch
    given_sha = text_field(body, "sha", "Content")
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        ref_name = f"refs/heads/{branch}"
        parent = git.ref(ref_name)
        if parent is None and (git.refs() or data is None):
            raise ApiError(404, f"Branch {branch} not found", documentation_url=DOCS)
        existing = git.entry(parent, path) if parent else None
        if existing is not None and stat.S_ISDIR(existing[0]):
            raise ApiError(422, f"{path} is a directory", documentation_url=DOCS)
        if data is None and existing is None:
            raise not_found()
        if existing is not None and given_sha is None:
            raise ApiError(
                422, 'Invalid request.\n\n"sha" wasn\'t supplied.', documentation_url=DOCS
            )
        if existing is not None and given_sha != existing[1].id.decode():
            raise ApiError(409, f"{path} does not match {given_sha}", documentation_url=DOCS)
        tree = git.write_path(parent, path, data)
        sha = git.new_commit(
            tree,
            [parent] if parent else [],
            message,
            author=_identity(body.get("author"))
            or _identity(body.get("committer"))
            or EMULATOR_IDENTITY,
            committer=_identity(body.get("committer")) or EMULATOR_IDENTITY,
        )
        if not git.update_ref(ref_name, parent, sha):
            now_at = git.ref(ref_name)
            raise ApiError(409, f"{branch} is at {now_at} but expected {parent}")
        commit = shapes.git_commit(urls, repo, git.commit(sha))
        written = None
        if data is not None:
            found = git.entry(sha, path)
            assert found is not None
            written = shapes.content(urls, repo, path, branch, found[0], found[1], body=False)
    status = 200 if existing is not None else 201
    return reply({"content": written, "commit": commit}, status=status)


def _identity(raw: object) -> bytes:
    """``{name, email}`` from a request body as git's ``Name <email>``; empty if absent."""
    if not isinstance(raw, dict) or not raw.get("name") or not raw.get("email"):
        return b""
    return f"{raw['name']} <{raw['email']}>".encode()
