"""git's receive-pack, read and written without a repository - checked against real git."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.proxy import git

IDENTITY = ["-c", "user.name=Agent", "-c", "user.email=agent@example.com"]


def _git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["git", *IDENTITY, *args], cwd=repo, capture_output=True, text=True, check=True, env=env
    )
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    (path / "app.py").write_text("def handler(x):\n    return x\n")
    _git(path, "add", ".")
    _git(path, "commit", "-q", "-m", "base")
    return path


def commit_change(repo: Path, content: str, date: str) -> str:
    (repo / "app.py").write_text(content)
    _git(repo, "add", ".")
    env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date, "PATH": "/usr/bin:/bin"}
    _git(repo, "commit", "-q", "-m", "validate input", env=env)
    return _git(repo, "rev-parse", "HEAD")


def push_body(repo: Path, old: str, new: str, ref: str, caps: str) -> bytes:
    pack = subprocess.run(
        ["git", "pack-objects", "--stdout", "--thin", "--revs", "-q"],
        cwd=repo,
        input=f"{new}\n^{old}\n".encode(),
        capture_output=True,
        check=True,
    ).stdout
    return git.pkt(f"{git.ZERO_SHA} {new} {ref}\0 {caps}\n".encode()) + git.FLUSH + pack


def test_a_push_is_read_down_to_the_tree_and_parents_of_its_commit(repo):
    base = _git(repo, "rev-parse", "HEAD")
    new = commit_change(
        repo, "def handler(x):\n    assert x\n    return x\n", "2026-01-01T10:00:00"
    )
    push = git.parse_receive_pack(
        push_body(repo, base, new, "refs/heads/agent/312", "report-status side-band-64k")
    )
    assert push.refs == ("refs/heads/agent/312",)
    assert {"report-status", "side-band-64k"} <= push.capabilities
    assert push.commits[new] == git.PushedCommit(_git(repo, "rev-parse", "HEAD^{tree}"), (base,))


def test_the_same_change_committed_again_is_the_same_push(repo):
    base = _git(repo, "rev-parse", "HEAD")
    change = "def handler(x):\n    assert x\n    return x\n"
    first = commit_change(repo, change, "2026-01-01T10:00:00")
    _git(repo, "reset", "-q", "--hard", base)
    second = commit_change(repo, change, "2026-01-01T10:05:00")
    other = "def handler(x):\n    return x or 0\n"
    _git(repo, "reset", "-q", "--hard", base)
    third = commit_change(repo, other, "2026-01-01T10:06:00")
    assert first != second
    prints = [
        git.parse_receive_pack(
            push_body(repo, base, sha, "refs/heads/agent/312", "report-status")
        ).fingerprint()
        for sha in (first, second, third)
    ]
    assert prints[0] == prints[1]
    assert prints[0] != prints[2]


def test_report_status_is_shaped_for_the_client_and_reads_back(repo):
    update = git.RefUpdate(git.ZERO_SHA, "a" * 40, "refs/heads/x")
    banded = git.Push((update,), frozenset({"report-status", "side-band-64k"}))
    plain = git.Push((update,), frozenset({"report-status"}))
    assert git.read_report(git.report_status(banded, message="hi")) == {"refs/heads/x": None}
    assert git.read_report(git.report_status(plain)) == {"refs/heads/x": None}
    assert git.report_status(plain).startswith(git.pkt(b"unpack ok\n"))
    refused = git.report_status(banded, {"refs/heads/x": "diverged"})
    assert git.read_report(refused) == {"refs/heads/x": "diverged"}


def test_advertised_refs_are_read_from_an_upload_pack_advertisement():
    advert = (
        git.pkt(b"# service=git-upload-pack\n")
        + git.FLUSH
        + git.pkt(b"a" * 40 + b" HEAD\0multi_ack side-band-64k\n")
        + git.pkt(b"b" * 40 + b" refs/heads/main\n")
        + git.FLUSH
    )
    assert git.advertised_refs(advert) == {"HEAD": "a" * 40, "refs/heads/main": "b" * 40}


@pytest.mark.parametrize(
    "body",
    [b"", b"zzzz", git.pkt(b"not a command\n") + git.FLUSH, git.pkt(b"x" * 40 + b"\n")],
)
def test_garbage_is_a_protocol_error_not_a_crash(body):
    with pytest.raises(git.GitProtocolError):
        git.parse_receive_pack(body)


@given(
    st.binary(max_size=300)
    | st.builds(
        lambda tail: (
            git.pkt(b"0" * 40 + b" " + b"1" * 40 + b" refs/heads/x\n") + git.FLUSH + b"PACK" + tail
        ),
        st.binary(max_size=200),
    )
)
@settings(max_examples=300, deadline=None)
def test_any_bytes_give_a_push_or_a_protocol_error(body):
    with contextlib.suppress(git.GitProtocolError):
        git.parse_receive_pack(body)
