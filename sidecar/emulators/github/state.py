"""The GitHub emulator's own records: repositories, issues and pull requests, comments,
labels, releases and the id counter, persisted as one JSON file.

Git data (commits, trees, refs) lives only in the bare repositories under
``DATA/repos/{owner}/{repo}.git``; this module keeps what GitHub keeps beside git.
``DATA/state.json`` is rewritten atomically (temporary file, fsync, rename) after every
change, so a killed and restarted emulator still has every pull request it answered 201
for.  All mutation happens on the event loop thread between awaits, so no locking is
needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

AUTHENTICATED_USER = "agent"


def now() -> str:
    """GitHub's timestamp format: ISO 8601 in UTC, second precision, ``Z`` suffix."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Label:
    id: int
    name: str
    color: str
    description: str | None


@dataclass
class Comment:
    id: int
    issue_number: int
    body: str
    user: str
    created_at: str
    updated_at: str


@dataclass
class Release:
    id: int
    tag_name: str
    target_commitish: str
    name: str | None
    body: str | None
    draft: bool
    prerelease: bool
    author: str
    created_at: str
    published_at: str | None


@dataclass
class Pull:
    """What a pull request adds to its issue.

    ``head_sha``/``base_sha`` are what the branches pointed at when last looked at; while
    the PR is open the live branch heads are shown instead (as GitHub does), and they are
    frozen here when it is closed or merged.
    """

    id: int
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str
    draft: bool = False
    merged: bool = False
    merged_at: str | None = None
    merged_by: str | None = None
    merge_commit_sha: str | None = None
    maintainer_can_modify: bool = False


@dataclass
class Issue:
    """An issue or, with ``pull`` set, a pull request: they share one number sequence."""

    number: int
    id: int
    title: str
    body: str | None
    user: str
    created_at: str
    updated_at: str
    state: str = "open"
    closed_at: str | None = None
    labels: list[str] = field(default_factory=list)
    pull: Pull | None = None


@dataclass
class Repository:
    id: int
    owner: str
    owner_type: str  # "User" or "Organization"
    name: str
    description: str | None
    private: bool
    default_branch: str
    created_at: str
    updated_at: str
    next_number: int = 1
    issues: list[Issue] = field(default_factory=list)
    comments: list[Comment] = field(default_factory=list)
    labels: list[Label] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)

    @property
    def full_name(self) -> str:
        return f"{self.owner}/{self.name}"

    def issue(self, number: int) -> Issue | None:
        return next((i for i in self.issues if i.number == number), None)

    def pulls(self) -> list[Issue]:
        return [i for i in self.issues if i.pull is not None]

    def label(self, name: str) -> Label | None:
        # Label names are unique regardless of case on GitHub.
        return next((lb for lb in self.labels if lb.name.lower() == name.lower()), None)

    def release_by_tag(self, tag: str) -> Release | None:
        return next((r for r in self.releases if r.tag_name == tag), None)


class State:
    """Every record of one emulator, loaded from and saved to ``DATA/state.json``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.repos_dir = data_dir / "repos"
        self.path = data_dir / "state.json"
        self.last_id = 0
        self.repos: list[Repository] = []

    @classmethod
    def open(cls, data_dir: Path) -> State:
        state = cls(data_dir)
        state.repos_dir.mkdir(parents=True, exist_ok=True)
        if state.path.exists():
            raw = json.loads(state.path.read_text())
            state.last_id = int(raw["last_id"])
            state.repos = [_repository(r) for r in raw["repos"]]
        return state

    def next_id(self) -> int:
        """Ids are unique across every kind of object, and never reused."""
        self.last_id += 1
        return self.last_id

    def repo(self, owner: str, name: str) -> Repository | None:
        # GitHub resolves owner and repository names without regard to case.
        key = (owner.lower(), name.lower())
        return next((r for r in self.repos if (r.owner.lower(), r.name.lower()) == key), None)

    def git_dir(self, repo: Repository) -> Path:
        return self.repos_dir / repo.owner / f"{repo.name}.git"

    def save(self) -> None:
        """Write the whole state atomically: readers see the old file or the new one."""
        payload = json.dumps(
            {"last_id": self.last_id, "repos": [asdict(r) for r in self.repos]}, indent=1
        )
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        with open(tmp, "w") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        # The rename itself is durable only once the directory entry is synced.
        fd = os.open(self.data_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _repository(raw: dict[str, Any]) -> Repository:
    issues = [_issue(i) for i in raw.pop("issues")]
    comments = [Comment(**c) for c in raw.pop("comments")]
    labels = [Label(**lb) for lb in raw.pop("labels")]
    releases = [Release(**r) for r in raw.pop("releases")]
    return Repository(**raw, issues=issues, comments=comments, labels=labels, releases=releases)


def _issue(raw: dict[str, Any]) -> Issue:
    pull = raw.pop("pull")
    return Issue(**raw, pull=Pull(**pull) if pull is not None else None)
