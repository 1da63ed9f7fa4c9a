"""The GitHub emulator's REST API, driven by PyGithub, requests and httpx as agents use them.

One emulator process serves the module; each test works in its own repository.
"""

from __future__ import annotations

import base64
import itertools
from collections.abc import Iterator

import httpx
import pytest
import requests
from github import Auth, Github, GithubException
from github.Repository import Repository

from tests.integration.emulators import TOKEN, Emulator, running_github

NOT_FOUND = {
    "message": "Not Found",
    "documentation_url": "https://docs.github.com/rest",
    "status": "404",
}
_names = itertools.count(1)
# PyGithub spaces requests out (0.25 s, and 1 s between writes) to spare github.com.
FAST = {"auth": Auth.Token("t"), "seconds_between_requests": 0, "seconds_between_writes": 0}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with running_github(tmp_path_factory.mktemp("github") / "data") as running:
        yield running


@pytest.fixture
def gh(emulator: Emulator) -> Iterator[Github]:
    client = Github(**FAST, base_url=emulator.url)
    yield client
    client.close()


@pytest.fixture
def repo(gh: Github) -> Repository:
    return gh.get_user().create_repo(f"repo-{next(_names)}", auto_init=True)


def branch_with_commit(repo: Repository, branch: str, path: str = "change.txt") -> str:
    """Create ``branch`` from main with one more commit on it; return its head sha."""
    main = repo.get_git_ref("heads/main").object.sha
    repo.create_git_ref(f"refs/heads/{branch}", main)
    made = repo.create_file(path, f"change {path}", f"{branch}\n", branch=branch)
    return made["commit"].sha


def test_the_authenticated_user_is_agent_and_reads_need_no_token(gh, emulator):
    me = gh.get_user()
    assert (me.login, me.type) == ("agent", "User")
    repo = me.create_repo(f"open-{next(_names)}")
    anonymous = requests.get(f"{emulator.url}/repos/agent/{repo.name}", timeout=10)
    assert anonymous.status_code == 200
    assert anonymous.headers["Content-Type"] == "application/json; charset=utf-8"
    assert requests.get(f"{emulator.url}/user", timeout=10).status_code == 401


def test_a_repository_created_with_auto_init_has_a_readme_commit_on_main(gh, emulator):
    repo = gh.get_user().create_repo("hello", auto_init=True, description="says hello")
    assert repo.full_name == "agent/hello"
    assert repo.default_branch == "main"
    assert repo.clone_url == f"{emulator.url}/agent/hello.git"
    assert repo.html_url == f"{emulator.url}/agent/hello"
    assert repo.owner.login == "agent"
    head = repo.get_branch("main").commit
    assert head.commit.message == "Initial commit"
    assert head.commit.author.name == "Emulator"
    assert head.commit.author.email == "emulator@example.com"
    assert head.parents == []
    readme = repo.get_contents("README.md")
    assert readme.decoded_content == b"# hello\nsays hello\n"
    assert gh.get_repo("agent/hello").id == repo.id


def test_an_organization_repository_starts_empty_without_auto_init(emulator):
    made = requests.post(
        f"{emulator.url}/orgs/acme/repos", json={"name": "tools"}, headers=TOKEN, timeout=10
    )
    assert made.status_code == 201
    body = made.json()
    assert body["owner"]["login"] == "acme"
    assert body["owner"]["type"] == "Organization"
    assert body["url"] == f"{emulator.url}/repos/acme/tools"
    assert httpx.get(f"{emulator.url}/repos/acme/tools/branches").json() == []
    empty = httpx.get(f"{emulator.url}/repos/acme/tools/git/ref/heads/main")
    assert (empty.status_code, empty.json()["message"]) == (409, "Git Repository is empty.")


def test_creating_a_repository_that_exists_is_refused(gh, repo):
    with pytest.raises(GithubException) as refused:
        gh.get_user().create_repo(repo.name)
    assert refused.value.status == 422
    assert refused.value.data["errors"] == [
        {
            "resource": "Repository",
            "code": "custom",
            "field": "name",
            "message": "name already exists on this account",
        }
    ]


def test_unknown_things_answer_githubs_404_body(emulator, repo):
    for path in (
        "/repos/agent/no-such-repo",
        f"/repos/agent/{repo.name}/pulls/999",
        f"/repos/agent/{repo.name}/git/ref/heads/nope",
        "/no/such/route/at/all",
    ):
        answer = httpx.get(f"{emulator.url}{path}")
        assert answer.status_code == 404, path
        assert answer.json() == NOT_FOUND, path
        assert answer.headers["content-type"] == "application/json; charset=utf-8"


def test_writes_without_a_token_are_refused_with_401(emulator, repo):
    base = f"{emulator.url}/repos/agent/{repo.name}"
    for method, url in (
        ("POST", f"{emulator.url}/user/repos"),
        ("POST", f"{base}/pulls"),
        ("PATCH", f"{base}/git/refs/heads/main"),
        ("PUT", f"{base}/contents/x.txt"),
        ("DELETE", f"{base}/git/refs/heads/main"),
    ):
        answer = requests.request(method, url, json={}, timeout=10)
        assert answer.status_code == 401, (method, url)
        assert answer.json() == {
            "message": "Requires authentication",
            "documentation_url": "https://docs.github.com/rest",
            "status": "401",
        }
    assert repo.get_git_ref("heads/main").ref == "refs/heads/main", "nothing was deleted"
    bearer = requests.post(
        f"{base}/labels",
        json={"name": "ok"},
        headers={"Authorization": "Bearer anything"},
        timeout=10,
    )
    assert bearer.status_code == 201


def test_refs_are_created_read_moved_only_forward_unless_forced_and_deleted(repo):
    main = repo.get_git_ref("heads/main")
    assert main.object.type == "commit"
    base = main.object.sha
    ahead = branch_with_commit(repo, "ahead")
    ref = repo.create_git_ref("refs/heads/topic", base)
    assert (ref.ref, ref.object.sha) == ("refs/heads/topic", base)
    names = [r.ref for r in repo.get_git_matching_refs("heads/")]
    assert names == ["refs/heads/ahead", "refs/heads/main", "refs/heads/topic"]

    ref.edit(ahead)  # a fast-forward
    assert repo.get_git_ref("heads/topic").object.sha == ahead
    with pytest.raises(GithubException) as backwards:
        ref.edit(base)
    assert backwards.value.status == 422
    assert backwards.value.data["message"] == "Update is not a fast forward"
    ref.edit(base, force=True)
    assert repo.get_git_ref("heads/topic").object.sha == base

    ref.delete()
    with pytest.raises(GithubException) as gone:
        repo.get_git_ref("heads/topic")
    assert gone.value.status == 404


def test_creating_a_ref_that_exists_or_points_nowhere_is_refused(emulator, repo):
    url = f"{emulator.url}/repos/agent/{repo.name}/git/refs"
    sha = repo.get_git_ref("heads/main").object.sha
    for body, message in (
        ({"ref": "refs/heads/main", "sha": sha}, "Reference already exists"),
        ({"ref": "refs/heads/x", "sha": "1" * 40}, "Object does not exist"),
        (
            {"ref": "heads/x", "sha": sha},
            "Reference name must contain at least three slash-separated components.",
        ),
    ):
        answer = requests.post(url, json=body, headers=TOKEN, timeout=10)
        assert answer.status_code == 422
        assert answer.json()["message"] == message


def test_a_second_pull_request_for_the_same_head_is_refused_with_githubs_body(repo):
    head = branch_with_commit(repo, "agent/312/att-1")
    pr = repo.create_pull(title="Fix", body="details", head="agent/312/att-1", base="main")
    assert (pr.number, pr.state, pr.merged, pr.draft) == (1, "open", False, False)
    assert pr.html_url.endswith(f"/agent/{repo.name}/pull/1")
    assert (pr.head.ref, pr.head.sha, pr.head.label) == (
        "agent/312/att-1",
        head,
        "agent:agent/312/att-1",
    )
    assert pr.base.ref == "main"
    assert (pr.commits, pr.changed_files, pr.additions, pr.deletions) == (1, 1, 1, 0)
    assert pr.mergeable is True

    with pytest.raises(GithubException) as again:
        repo.create_pull(title="Fix again", body="", head="agent:agent/312/att-1", base="main")
    assert again.value.status == 422
    assert again.value.data == {
        "message": "Validation Failed",
        "errors": [
            {
                "resource": "PullRequest",
                "code": "custom",
                "message": "A pull request already exists for agent:agent/312/att-1.",
            }
        ],
        "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
        "status": "422",
    }


def test_a_pull_request_needs_an_existing_head_with_commits_of_its_own(repo):
    with pytest.raises(GithubException) as missing:
        repo.create_pull(title="t", body="", head="nope", base="main")
    assert missing.value.data["errors"] == [
        {"resource": "PullRequest", "field": "head", "code": "invalid"}
    ]
    repo.create_git_ref("refs/heads/same", repo.get_git_ref("heads/main").object.sha)
    with pytest.raises(GithubException) as empty:
        repo.create_pull(title="t", body="", head="same", base="main")
    assert empty.value.status == 422
    assert empty.value.data["errors"] == [
        {"resource": "PullRequest", "code": "custom", "message": "No commits between main and same"}
    ]


def test_pull_requests_are_listed_by_head_base_and_state_as_github_filters_them(emulator, repo):
    branch_with_commit(repo, "one", "one.txt")
    branch_with_commit(repo, "two", "two.txt")
    first = repo.create_pull(title="one", body="", head="one", base="main")
    second = repo.create_pull(title="two", body="", head="two", base="main")
    first.edit(state="closed")

    def numbers(**query: str) -> list[int]:
        return [p.number for p in repo.get_pulls(**query)]

    assert numbers() == [second.number]
    assert numbers(state="all") == [second.number, first.number]  # newest first
    assert numbers(state="all", direction="asc") == [first.number, second.number]
    assert numbers(state="closed") == [first.number]
    assert numbers(state="all", head="agent:one") == [first.number]
    assert numbers(state="all", head="someone-else:one") == []
    # Without the owner prefix GitHub ignores the head filter: every PR comes back.
    assert numbers(state="all", head="one") == [second.number, first.number]
    assert numbers(state="all", base="main") == [second.number, first.number]
    assert numbers(state="all", base="other") == []

    page = httpx.get(f"{emulator.url}/repos/agent/{repo.name}/pulls?state=all&per_page=1")
    assert [p["number"] for p in page.json()] == [second.number]
    assert 'rel="next"' in page.headers["link"]
    assert repo.get_pulls(state="all").totalCount == 2


def test_merging_a_pull_request_moves_its_base_and_closes_it(repo, emulator):
    head = branch_with_commit(repo, "feature")
    base = repo.get_git_ref("heads/main").object.sha
    pr = repo.create_pull(title="Feature", body="", head="feature", base="main")
    status = pr.merge(commit_title="Merge the feature")
    assert status.merged is True
    assert status.message == "Pull Request successfully merged"
    merge = repo.get_commit(status.sha)
    assert [p.sha for p in merge.parents] == [base, head]
    assert merge.commit.tree.sha == repo.get_commit(head).commit.tree.sha
    assert merge.commit.message.startswith("Merge the feature")
    assert repo.get_git_ref("heads/main").object.sha == status.sha

    merged = repo.get_pull(pr.number)
    assert (merged.state, merged.merged, merged.merge_commit_sha) == ("closed", True, status.sha)
    assert merged.is_merged()
    with pytest.raises(GithubException) as twice:
        merged.merge()
    assert (twice.value.status, twice.value.data["message"]) == (
        405,
        "Pull Request is not mergeable",
    )
    summary = emulator.state()[repo.full_name]["pulls"]
    assert summary == [
        {
            "number": pr.number,
            "title": "Feature",
            "head": "feature",
            "head_sha": head,
            "base": "main",
            "base_sha": base,
            "state": "closed",
            "merged": True,
            "merge_commit_sha": status.sha,
            "labels": [],
        }
    ]


def test_a_pull_request_whose_base_moved_is_merged_with_a_three_way_merge(repo):
    branch_with_commit(repo, "mine", "mine.txt")
    branch_with_commit(repo, "clash", "mine.txt")
    repo.create_file("theirs.txt", "meanwhile on main", "main\n", branch="main")
    clean = repo.create_pull(title="mine", body="", head="mine", base="main")
    assert clean.merge().merged
    paths = {c.path for c in repo.get_contents("", ref="main")}
    assert {"README.md", "mine.txt", "theirs.txt"} <= paths

    conflicting = repo.create_pull(title="clash", body="", head="clash", base="main")
    assert repo.get_pull(conflicting.number).mergeable is False
    with pytest.raises(GithubException) as refused:
        conflicting.merge()
    assert refused.value.status == 405


def test_comments_on_a_pull_request_are_issue_comments(repo):
    branch_with_commit(repo, "talk")
    pr = repo.create_pull(title="Talk", body="", head="talk", base="main")
    comment = pr.create_issue_comment("Looks good")
    assert comment.body == "Looks good"
    assert comment.user.login == "agent"
    assert comment.html_url.endswith(f"/pull/{pr.number}#issuecomment-{comment.id}")
    pr.create_issue_comment("Second")
    assert [c.body for c in pr.get_issue_comments()] == ["Looks good", "Second"]
    issue = repo.get_issue(pr.number)
    assert issue.pull_request is not None
    assert issue.pull_request.html_url == pr.html_url
    assert issue.comments == 2
    assert repo.get_pull(pr.number).comments == 2


def test_labels_are_created_once_and_put_on_pull_requests(repo, emulator):
    bug = repo.create_label("bug", "d73a4a", "Something is broken")
    assert (bug.name, bug.color, bug.description) == ("bug", "d73a4a", "Something is broken")
    with pytest.raises(GithubException) as twice:
        repo.create_label("Bug", "000000")
    assert twice.value.status == 422
    assert twice.value.data["errors"] == [
        {"resource": "Label", "code": "already_exists", "field": "name"}
    ]
    branch_with_commit(repo, "labelled")
    pr = repo.create_pull(title="Labelled", body="", head="labelled", base="main")
    answer = requests.post(
        f"{emulator.url}/repos/agent/{repo.name}/issues/{pr.number}/labels",
        json={"labels": ["bug", "agent"]},
        headers=TOKEN,
        timeout=10,
    )
    assert answer.status_code == 200
    assert [(lb["name"], lb["color"]) for lb in answer.json()] == [
        ("bug", "d73a4a"),
        ("agent", "ededed"),
    ]
    pr.add_to_labels("agent", "ready")  # PyGithub sends a bare list
    assert [lb.name for lb in repo.get_pull(pr.number).labels] == ["bug", "agent", "ready"]
    assert sorted(lb.name for lb in repo.get_labels()) == ["agent", "bug", "ready"]


def test_a_release_creates_its_tag_and_a_second_release_of_the_tag_is_refused(repo):
    main = repo.get_git_ref("heads/main").object.sha
    release = repo.create_git_release("v1.0.0", "First", "notes")
    assert (release.tag_name, release.name, release.body) == ("v1.0.0", "First", "notes")
    assert release.html_url.endswith(f"/agent/{repo.name}/releases/tag/v1.0.0")
    assert repo.get_git_ref("tags/v1.0.0").object.sha == main
    assert repo.get_release("v1.0.0").id == release.id
    assert [r.tag_name for r in repo.get_releases()] == ["v1.0.0"]
    with pytest.raises(GithubException) as twice:
        repo.create_git_release("v1.0.0", "Again", "")
    assert twice.value.status == 422
    assert twice.value.data["errors"] == [
        {"resource": "Release", "code": "already_exists", "field": "tag_name"}
    ]


def test_contents_are_created_updated_and_guarded_by_their_sha(repo, emulator):
    made = repo.create_file("docs/notes.md", "add notes", "v1\n")
    blob = made["content"].sha
    assert made["content"].path == "docs/notes.md"
    assert repo.get_git_ref("heads/main").object.sha == made["commit"].sha
    read = repo.get_contents("docs/notes.md")
    assert (read.decoded_content, read.sha, read.encoding) == (b"v1\n", blob, "base64")

    url = f"{emulator.url}/repos/agent/{repo.name}/contents/docs/notes.md"
    content = base64.b64encode(b"v2\n").decode()
    no_sha = requests.put(url, json={"message": "m", "content": content}, headers=TOKEN, timeout=10)
    assert no_sha.status_code == 422
    assert no_sha.json()["message"] == 'Invalid request.\n\n"sha" wasn\'t supplied.'
    stale = requests.put(
        url, json={"message": "m", "content": content, "sha": "0" * 40}, headers=TOKEN, timeout=10
    )
    assert stale.status_code == 409
    assert "does not match" in stale.json()["message"]

    updated = repo.update_file("docs/notes.md", "update notes", "v2\n", blob)
    assert updated["commit"].parents[0].sha == made["commit"].sha
    assert repo.get_contents("docs/notes.md").decoded_content == b"v2\n"
    created = requests.put(
        f"{emulator.url}/repos/agent/{repo.name}/contents/new.txt",
        json={"message": "new", "content": content},
        headers=TOKEN,
        timeout=10,
    )
    assert created.status_code == 201
    assert created.json()["content"]["sha"] == repo.get_contents("new.txt").sha
    root = httpx.get(f"{emulator.url}/repos/agent/{repo.name}/contents").json()
    assert [(e["path"], e["type"]) for e in root] == [
        ("README.md", "file"),
        ("docs", "dir"),
        ("new.txt", "file"),
    ]


def test_pygithub_works_with_the_enterprise_api_v3_base_url(emulator, repo):
    client = Github(**FAST, base_url=f"{emulator.url}/api/v3")
    try:
        same = client.get_repo(repo.full_name)
        assert same.url == f"{emulator.url}/api/v3/repos/{repo.full_name}"
        branch_with_commit(same, "enterprise")
        pr = same.create_pull(title="GHE", body="", head="enterprise", base="main")
        assert [p.number for p in same.get_pulls(head="agent:enterprise")] == [pr.number]
        assert same.get_pull(pr.number).merge().merged
    finally:
        client.close()


def test_emulator_state_lists_branches_pulls_and_counts(emulator, repo):
    head = branch_with_commit(repo, "summary")
    pr = repo.create_pull(title="Summary", body="", head="summary", base="main")
    pr.create_issue_comment("one")
    repo.create_git_release("v0", "v0", "")
    state = emulator.state()[repo.full_name]
    main = repo.get_branch("main").commit
    assert state["branches"]["main"] == {"sha": main.sha, "tree": main.commit.tree.sha}
    assert state["branches"]["summary"]["sha"] == head
    assert state["pulls"][0]["head_sha"] == head
    assert (state["pulls"][0]["state"], state["pulls"][0]["merged"]) == ("open", False)
    assert (state["comments"], state["labels"], state["releases"]) == (1, 0, 1)
    assert state["tags"] == {"v0": main.sha}


def test_a_restarted_emulator_keeps_its_pull_requests(tmp_path):
    data = tmp_path / "data"
    with running_github(data) as first:
        client = Github(**FAST, base_url=first.url)
        repo = client.get_user().create_repo("durable", auto_init=True)
        branch_with_commit(repo, "keep")
        pr = repo.create_pull(title="Keep me", body="", head="keep", base="main")
        client.close()
        before = first.state()
        assert first.child.terminate() == 0
    with running_github(data) as second:
        assert second.state() == before
        client = Github(**FAST, base_url=second.url)
        again = client.get_repo("agent/durable")
        assert [p.title for p in again.get_pulls()] == ["Keep me"]
        with pytest.raises(GithubException) as duplicate:
            again.create_pull(title="Keep me", body="", head="keep", base="main")
        assert duplicate.value.status == 422
        assert again.get_pull(pr.number).html_url.startswith(second.url)
        client.close()
