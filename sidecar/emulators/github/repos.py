"""Users, repositories, refs, branches and commits of the GitHub emulator.

Accounts are implicit: the authenticated user is always ``agent`` (any token is that
user), and any other login is an organization that exists as soon as it is named.
"""

from __future__ import annotations

import re
from urllib.parse import quote

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
)
from sidecar.emulators.github.gitdata import GitRepo, init_bare
from sidecar.emulators.github.state import AUTHENTICATED_USER, Repository, now

routes = web.RouteTableDef()

REPO = "/repos/{owner}/{repo}"
CREATE_FOR_USER = (
    "https://docs.github.com/rest/repos/repos#create-a-repository-for-the-authenticated-user"
)
CREATE_FOR_ORG = "https://docs.github.com/rest/repos/repos#create-an-organization-repository"
REFS_DOCS = "https://docs.github.com/rest/git/refs"


@routes.get("/user")
async def authenticated_user(request: web.Request) -> web.Response:
    if not request.headers.get("Authorization"):
        raise ApiError(401, "Requires authentication")
    me = shapes.user(urls_of(request), AUTHENTICATED_USER)
    owned = [r for r in state_of(request).repos if r.owner == AUTHENTICATED_USER]
    me |= {
        "name": "Agent",
        "company": None,
        "blog": "",
        "location": None,
        "email": None,
        "hireable": None,
        "bio": None,
        "twitter_username": None,
        "public_repos": sum(1 for r in owned if not r.private),
        "total_private_repos": sum(1 for r in owned if r.private),
        "owned_private_repos": sum(1 for r in owned if r.private),
        "public_gists": 0,
        "followers": 0,
        "following": 0,
        "created_at": "2020-01-01T00:00:00Z",
        "updated_at": "2020-01-01T00:00:00Z",
    }
    return reply(me)


@routes.get("/users/{login}")
async def get_user(request: web.Request) -> web.Response:
    login = request.match_info["login"]
    kind = "User" if login.lower() == AUTHENTICATED_USER else "Organization"
    return reply(shapes.user(urls_of(request), login, kind))


@routes.get("/orgs/{org}")
async def get_org(request: web.Request) -> web.Response:
    org = request.match_info["org"]
    if org.lower() == AUTHENTICATED_USER:
        raise not_found()
    found = shapes.user(urls_of(request), org, "Organization")
    keep = ("login", "id", "node_id", "url", "repos_url", "events_url", "avatar_url")
    return reply({k: found[k] for k in keep} | {"description": None, "type": "Organization"})


@routes.post("/user/repos")
async def create_user_repo(request: web.Request) -> web.Response:
    return await _create_repo(request, AUTHENTICATED_USER, "User", CREATE_FOR_USER)


@routes.post("/orgs/{org}/repos")
async def create_org_repo(request: web.Request) -> web.Response:
    org = request.match_info["org"]
    if org.lower() == AUTHENTICATED_USER:
        raise not_found()
    return await _create_repo(request, org, "Organization", CREATE_FOR_ORG)


async def _create_repo(request: web.Request, owner: str, kind: str, docs: str) -> web.Response:
    body = await object_body(request)
    name = text_field(body, "name", "Repository")
    if not name:
        raise missing_field("Repository", "name", docs)
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name)  # GitHub's own renaming of odd characters
    state = state_of(request)
    if state.repo(owner, name) is not None:
        raise ApiError(
            422,
            "Repository creation failed.",
            errors=[
                {
                    "resource": "Repository",
                    "code": "custom",
                    "field": "name",
                    "message": "name already exists on this account",
                }
            ],
            documentation_url=docs,
        )
    stamp = now()
    repo = Repository(
        id=state.next_id(),
        owner=owner,
        owner_type=kind,
        name=name,
        description=text_field(body, "description", "Repository"),
        private=bool(body.get("private", False)),
        default_branch=text_field(body, "default_branch", "Repository") or "main",
        created_at=stamp,
        updated_at=stamp,
    )
    init_bare(state.git_dir(repo), repo.default_branch)
    if body.get("auto_init"):
        readme = f"# {name}\n" + (f"{repo.description}\n" if repo.description else "")
        with GitRepo(state.git_dir(repo)) as git:
            tree = git.write_path(None, "README.md", readme.encode())
            sha = git.new_commit(tree, [], "Initial commit")
            git.create_ref(f"refs/heads/{repo.default_branch}", sha)
    state.repos.append(repo)
    state.save()
    answer = reply(shapes.repository(urls_of(request), repo), status=201)
    answer.headers["Location"] = urls_of(request).repo(repo)
    return answer


@routes.get(REPO)
async def get_repo(request: web.Request) -> web.Response:
    return reply(shapes.repository(urls_of(request), repo_of(request)))


# -- refs ----------------------------------------------------------------------------------


def _ref_objects(request: web.Request, repo: Repository, prefix: str) -> list[Json]:
    with GitRepo(state_of(request).git_dir(repo)) as git:
        found = git.refs(prefix)
        if not git.refs():
            raise ApiError(409, "Git Repository is empty.", documentation_url=REFS_DOCS)
        urls = urls_of(request)
        return [
            shapes.git_ref(urls, repo, name, sha, git.object_type(sha))
            for name, sha in found.items()
        ]


@routes.get(REPO + "/git/ref/{ref:.+}")
async def get_ref(request: web.Request) -> web.Response:
    name = f"refs/{request.match_info['ref']}"
    found = [r for r in _ref_objects(request, repo_of(request), name) if r["ref"] == name]
    if not found:
        raise not_found()
    return reply(found[0])


@routes.get(REPO + "/git/matching-refs/{ref:.*}")
async def matching_refs(request: web.Request) -> web.Response:
    prefix = f"refs/{request.match_info['ref']}"
    return paginate(request, _ref_objects(request, repo_of(request), prefix))


@routes.get(REPO + "/git/refs")
async def list_refs(request: web.Request) -> web.Response:
    return paginate(request, _ref_objects(request, repo_of(request), "refs/"))


@routes.get(REPO + "/git/refs/{ref:.+}")
async def get_refs_legacy(request: web.Request) -> web.Response:
    # The older form: an exact name answers one object, a prefix answers a list.
    name = f"refs/{request.match_info['ref']}"
    found = _ref_objects(request, repo_of(request), name)
    exact = [r for r in found if r["ref"] == name]
    if exact:
        return reply(exact[0])
    below = [r for r in found if r["ref"].startswith(name.rstrip("/") + "/")]
    if not below:
        raise not_found()
    return reply(below)


@routes.post(REPO + "/git/refs")
async def create_ref(request: web.Request) -> web.Response:
    repo = repo_of(request)
    body = await object_body(request)
    name, sha = text_field(body, "ref", "Reference"), text_field(body, "sha", "Reference")
    if not name:
        raise missing_field("Reference", "ref", REFS_DOCS)
    if not sha:
        raise missing_field("Reference", "sha", REFS_DOCS)
    if not name.startswith("refs/") or name.count("/") < 2:
        raise ApiError(
            422,
            "Reference name must contain at least three slash-separated components.",
            documentation_url=REFS_DOCS,
        )
    with GitRepo(state_of(request).git_dir(repo)) as git:
        if not git.exists(sha):
            raise ApiError(422, "Object does not exist", documentation_url=REFS_DOCS)
        if not git.create_ref(name, sha):
            raise ApiError(422, "Reference already exists", documentation_url=REFS_DOCS)
        found = shapes.git_ref(urls_of(request), repo, name, sha, git.object_type(sha))
    answer = reply(found, status=201)
    answer.headers["Location"] = found["url"]
    return answer


@routes.patch(REPO + "/git/refs/{ref:.+}")
async def update_ref(request: web.Request) -> web.Response:
    repo = repo_of(request)
    name = f"refs/{request.match_info['ref']}"
    body = await object_body(request)
    sha = text_field(body, "sha", "Reference")
    if not sha:
        raise missing_field("Reference", "sha", REFS_DOCS)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        old = git.ref(name)
        if old is None:
            raise ApiError(422, "Reference does not exist", documentation_url=REFS_DOCS)
        if not git.exists(sha):
            raise ApiError(422, "Object does not exist", documentation_url=REFS_DOCS)
        if not body.get("force") and not git.is_ancestor(old, sha):
            raise ApiError(422, "Update is not a fast forward", documentation_url=REFS_DOCS)
        if not git.update_ref(name, old, sha):  # moved under us (a concurrent push)
            raise ApiError(422, "Reference cannot be updated", documentation_url=REFS_DOCS)
        return reply(shapes.git_ref(urls_of(request), repo, name, sha, git.object_type(sha)))


@routes.delete(REPO + "/git/refs/{ref:.+}")
async def delete_ref(request: web.Request) -> web.Response:
    repo = repo_of(request)
    name = f"refs/{request.match_info['ref']}"
    with GitRepo(state_of(request).git_dir(repo)) as git:
        old = git.ref(name)
        if old is None or not git.delete_ref(name, old):
            raise ApiError(422, "Reference does not exist", documentation_url=REFS_DOCS)
    return web.Response(status=204)


# -- branches and commits ------------------------------------------------------------------


@routes.get(REPO + "/branches")
async def list_branches(request: web.Request) -> web.Response:
    repo = repo_of(request)
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        branches = git.branches()
    return paginate(
        request,
        [
            {
                "name": name,
                "commit": {"sha": sha, "url": f"{urls.repo(repo)}/commits/{sha}"},
                "protected": False,
            }
            for name, sha in branches.items()
        ],
    )


@routes.get(REPO + "/branches/{branch:.+}")
async def get_branch(request: web.Request) -> web.Response:
    repo = repo_of(request)
    name = request.match_info["branch"]
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        sha = git.branches().get(name)
        if sha is None:
            raise ApiError(404, "Branch not found")
        head = shapes.commit(urls, repo, git.commit(sha))
    api = f"{urls.repo(repo)}/branches/{quote(name)}"
    return reply(
        {
            "name": name,
            "commit": head,
            "_links": {"self": api, "html": f"{urls.repo_web(repo)}/tree/{quote(name)}"},
            "protected": False,
            "protection": {
                "enabled": False,
                "required_status_checks": {
                    "enforcement_level": "off",
                    "contexts": [],
                    "checks": [],
                },
            },
            "protection_url": f"{api}/protection",
        }
    )


@routes.get(REPO + "/commits")
async def list_commits(request: web.Request) -> web.Response:
    repo = repo_of(request)
    start = request.query.get("sha") or repo.default_branch
    urls = urls_of(request)
    with GitRepo(state_of(request).git_dir(repo)) as git:
        if not git.refs():
            raise ApiError(409, "Git Repository is empty.")
        head = git.resolve(start)
        if head is None:
            raise not_found()
        walker = git.repo.get_walker(include=[head.id])
        return paginate(request, [shapes.commit(urls, repo, e.commit) for e in walker])


@routes.get(REPO + "/commits/{ref:.+}")
async def get_commit(request: web.Request) -> web.Response:
    repo = repo_of(request)
    ref = request.match_info["ref"]
    with GitRepo(state_of(request).git_dir(repo)) as git:
        if not git.refs():
            raise ApiError(409, "Git Repository is empty.")
        found = git.resolve(ref)
        if found is None:
            raise ApiError(422, f"No commit found for SHA: {ref}")
        return reply(shapes.commit(urls_of(request), repo, found))


@routes.get(REPO + "/git/commits/{sha}")
async def get_git_commit(request: web.Request) -> web.Response:
    repo = repo_of(request)
    sha = request.match_info["sha"]
    with GitRepo(state_of(request).git_dir(repo)) as git:
        if not git.exists(sha) or git.object_type(sha) != "commit":
            raise not_found()
        return reply(shapes.git_commit(urls_of(request), repo, git.commit(sha)))
