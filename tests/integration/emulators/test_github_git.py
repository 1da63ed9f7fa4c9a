"""git smart HTTP of the GitHub emulator, driven by the real git CLI.

One emulator process serves the module; each test works in its own repository and its
own git home, with no user or system git configuration.
"""

from __future__ import annotations

import base64
import gzip
import itertools
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.emulators import TOKEN, Emulator, git, git_env, running_github

_names = itertools.count(1)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with running_github(tmp_path_factory.mktemp("github") / "data") as running:
        yield running


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return git_env(tmp_path / "home")


@pytest.fixture
def repo(emulator: Emulator) -> str:
    """A new repository with an initial commit on main; its full name."""
    name = f"git-{next(_names)}"
    made = httpx.post(
        f"{emulator.url}/user/repos", json={"name": name, "auto_init": True}, headers=TOKEN
    )
    assert made.status_code == 201
    return str(made.json()["full_name"])


def clone(emulator: Emulator, env: dict[str, str], repo: str, into: Path) -> Path:
    git(env, into.parent, "clone", f"{emulator.url}/{repo}.git", into.name)
    return into


def commit(env: dict[str, str], work: Path, name: str, text: str) -> str:
    (work / name).write_text(text)
    git(env, work, "add", name)
    git(env, work, "commit", "-m", f"write {name}")
    return git(env, work, "rev-parse", "HEAD").strip()


def api(emulator: Emulator, repo: str, path: str) -> httpx.Response:
    return httpx.get(f"{emulator.url}/repos/{repo}{path}")


def test_git_clones_commits_and_pushes_a_new_branch_over_http(emulator, env, repo, tmp_path):
    work = clone(emulator, env, repo, tmp_path / "work")
    assert (work / "README.md").read_text().startswith("# git-")
    git(env, work, "checkout", "-b", "agent/312/att-1")
    head = commit(env, work, "patch.py", "print('fixed')\n")
    pushed = git(env, work, "push", "-u", "origin", "agent/312/att-1")
    assert "[new branch]" in pushed

    branch = api(emulator, repo, "/branches/agent/312/att-1").json()
    assert branch["commit"]["sha"] == head
    tree = git(env, work, "rev-parse", "HEAD^{tree}").strip()
    assert emulator.state()[repo]["branches"]["agent/312/att-1"] == {"sha": head, "tree": tree}


def test_a_non_fast_forward_push_is_rejected_and_a_forced_one_accepted(
    emulator, env, repo, tmp_path
):
    first = clone(emulator, env, repo, tmp_path / "first")
    second = clone(emulator, env, repo, tmp_path / "second")
    landed = commit(env, first, "a.txt", "first\n")
    git(env, first, "push", "origin", "main")

    diverged = commit(env, second, "b.txt", "second\n")
    refused = git(env, second, "push", "origin", "main", check=False)
    assert "[rejected]" in refused
    assert api(emulator, repo, "/git/ref/heads/main").json()["object"]["sha"] == landed

    git(env, second, "push", "--force", "origin", "main")
    assert api(emulator, repo, "/git/ref/heads/main").json()["object"]["sha"] == diverged


def test_fetch_brings_commits_made_through_the_rest_api(emulator, env, repo, tmp_path):
    work = clone(emulator, env, repo, tmp_path / "work")
    made = httpx.put(
        f"{emulator.url}/repos/{repo}/contents/docs/api.md",
        json={"message": "from the API", "content": base64.b64encode(b"api\n").decode()},
        headers=TOKEN,
    )
    assert made.status_code == 201
    git(env, work, "fetch", "origin")
    assert git(env, work, "rev-parse", "origin/main").strip() == made.json()["commit"]["sha"]
    assert git(env, work, "show", "origin/main:docs/api.md") == "api\n"


def test_pushing_to_a_pull_requests_branch_moves_its_head_and_merging_reaches_git(
    emulator, env, repo, tmp_path
):
    work = clone(emulator, env, repo, tmp_path / "work")
    base = git(env, work, "rev-parse", "HEAD").strip()
    git(env, work, "checkout", "-b", "feature")
    commit(env, work, "one.txt", "1\n")
    git(env, work, "push", "origin", "feature")
    pr = httpx.post(
        f"{emulator.url}/repos/{repo}/pulls",
        json={"title": "Feature", "head": "feature", "base": "main"},
        headers=TOKEN,
    ).json()
    newer = commit(env, work, "two.txt", "2\n")
    git(env, work, "push", "origin", "feature")
    assert api(emulator, repo, f"/pulls/{pr['number']}").json()["head"]["sha"] == newer

    merged = httpx.put(
        f"{emulator.url}/repos/{repo}/pulls/{pr['number']}/merge", json={}, headers=TOKEN
    )
    assert merged.status_code == 200
    git(env, work, "fetch", "origin")
    parents = git(env, work, "rev-list", "--parents", "-n1", "origin/main").split()
    assert parents == [merged.json()["sha"], base, newer]


def test_both_url_forms_and_both_protocol_versions_work(emulator, env, repo, tmp_path):
    head = api(emulator, repo, "/branches/main").json()["commit"]["sha"]
    for url in (f"{emulator.url}/{repo}.git", f"{emulator.url}/{repo}"):
        for version in ("0", "2"):
            listed = git(env, tmp_path, "-c", f"protocol.version={version}", "ls-remote", url)
            assert f"{head}\trefs/heads/main" in listed, (url, version)
    missing = git(env, tmp_path, "ls-remote", f"{emulator.url}/agent/nope.git", check=False)
    assert "not found" in missing


def test_a_push_with_a_token_in_the_remote_url_is_accepted(emulator, env, repo, tmp_path):
    work = clone(emulator, env, repo, tmp_path / "work")
    with_token = emulator.url.replace("http://", "http://x-access-token:secret@")
    git(env, work, "remote", "set-url", "origin", f"{with_token}/{repo}.git")
    head = commit(env, work, "c.txt", "c\n")
    git(env, work, "push", "origin", "main")
    assert api(emulator, repo, "/commits/main").json()["sha"] == head


def test_a_gzip_encoded_fetch_request_is_inflated_before_git_reads_it(emulator, repo):
    head = api(emulator, repo, "/branches/main").json()["commit"]["sha"]
    want = f"want {head}\n"
    request = f"{len(want) + 4:04x}{want}00000009done\n".encode()
    answer = httpx.post(
        f"{emulator.url}/{repo}.git/git-upload-pack",
        content=gzip.compress(request),
        headers={
            "Content-Type": "application/x-git-upload-pack-request",
            "Content-Encoding": "gzip",
        },
    )
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/x-git-upload-pack-result"
    assert answer.content.startswith(b"0008NAK\nPACK")
