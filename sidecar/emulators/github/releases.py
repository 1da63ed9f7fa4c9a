"""Releases of the GitHub emulator.

Publishing a release whose tag does not exist creates the tag (a lightweight
``refs/tags/{tag}`` at ``target_commitish``), as GitHub does; a draft creates it only
when it is published.  Deleting a release keeps its tag.
"""

from __future__ import annotations

from aiohttp import web

from sidecar.emulators.github import shapes
from sidecar.emulators.github.api import (
    ApiError,
    Json,
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
from sidecar.emulators.github.state import AUTHENTICATED_USER, Release, Repository, now

routes = web.RouteTableDef()

RELEASES = "/repos/{owner}/{repo}/releases"
RELEASE = RELEASES + r"/{id:\d+}"
DOCS = "https://docs.github.com/rest/releases/releases"


def _tag(request: web.Request, repo: Repository, release: Release) -> None:
    """Create the release's tag at its target if the tag does not exist yet."""
    with GitRepo(state_of(request).git_dir(repo)) as git:
        name = f"refs/tags/{release.tag_name}"
        if git.ref(name) is not None:
            return
        target = git.resolve(release.target_commitish)
        if target is None:
            raise validation_failed(
                {"resource": "Release", "code": "invalid", "field": "target_commitish"},
                documentation_url=DOCS,
            )
        git.create_ref(name, target.id.decode())


def _duplicate_tag() -> ApiError:
    return validation_failed(
        {"resource": "Release", "code": "already_exists", "field": "tag_name"},
        documentation_url=DOCS,
    )


@routes.post(RELEASES)
async def create_release(request: web.Request) -> web.Response:
    repo = repo_of(request)
    body = await object_body(request)
    tag = text_field(body, "tag_name", "Release")
    if not tag:
        raise missing_field("Release", "tag_name", DOCS)
    if repo.release_by_tag(tag) is not None:
        raise _duplicate_tag()
    state = state_of(request)
    draft = bool(body.get("draft", False))
    stamp = now()
    release = Release(
        id=state.next_id(),
        tag_name=tag,
        target_commitish=text_field(body, "target_commitish", "Release") or repo.default_branch,
        name=text_field(body, "name", "Release"),
        body=text_field(body, "body", "Release"),
        draft=draft,
        prerelease=bool(body.get("prerelease", False)),
        author=AUTHENTICATED_USER,
        created_at=stamp,
        published_at=None if draft else stamp,
    )
    if not draft:
        _tag(request, repo, release)
    repo.releases.append(release)
    state.save()
    found = shapes.release(urls_of(request), repo, release)
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


@routes.get(RELEASES)
async def list_releases(request: web.Request) -> web.Response:
    repo = repo_of(request)
    urls = urls_of(request)
    newest_first = sorted(repo.releases, key=lambda r: r.id, reverse=True)
    return paginate(request, [shapes.release(urls, repo, r) for r in newest_first])


@routes.get(RELEASES + "/latest")
async def latest_release(request: web.Request) -> web.Response:
    repo = repo_of(request)
    published = [r for r in repo.releases if not r.draft and not r.prerelease]
    if not published:
        raise not_found()
    latest = max(published, key=lambda r: (r.published_at or "", r.id))
    return reply(shapes.release(urls_of(request), repo, latest))


@routes.get(RELEASES + "/tags/{tag:.+}")
async def release_by_tag(request: web.Request) -> web.Response:
    repo = repo_of(request)
    found = repo.release_by_tag(request.match_info["tag"])
    if found is None:
        raise not_found()
    return reply(shapes.release(urls_of(request), repo, found))


def _release_of(request: web.Request, repo: Repository) -> Release:
    wanted = int(request.match_info["id"])
    found = next((r for r in repo.releases if r.id == wanted), None)
    if found is None:
        raise not_found()
    return found


@routes.get(RELEASE)
async def get_release(request: web.Request) -> web.Response:
    repo = repo_of(request)
    return reply(shapes.release(urls_of(request), repo, _release_of(request, repo)))


@routes.patch(RELEASE)
async def update_release(request: web.Request) -> web.Response:
    repo = repo_of(request)
    release = _release_of(request, repo)
    body: Json = await object_body(request)
    tag = text_field(body, "tag_name", "Release")
    if tag and tag != release.tag_name:
        if repo.release_by_tag(tag) is not None:
            raise _duplicate_tag()
        release.tag_name = tag
    for name in ("target_commitish", "name", "body"):
        if name in body:
            setattr(release, name, text_field(body, name, "Release"))
    if "prerelease" in body:
        release.prerelease = bool(body["prerelease"])
    if "draft" in body:
        release.draft = bool(body["draft"])
    if not release.draft:
        _tag(request, repo, release)
        release.published_at = release.published_at or now()
    state_of(request).save()
    return reply(shapes.release(urls_of(request), repo, release))


@routes.delete(RELEASE)
async def delete_release(request: web.Request) -> web.Response:
    repo = repo_of(request)
    repo.releases.remove(_release_of(request, repo))
    state_of(request).save()
    return web.Response(status=204)
