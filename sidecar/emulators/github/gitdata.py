"""Reading and writing the bare repositories with dulwich: what the REST API does to git.

The emulator never keeps git data of its own: refs, commits and trees are read from the
bare repository on every request (``git push`` over smart HTTP changes them behind its
back), and every ref change is a compare-and-swap on the ref file, so it races safely
with a concurrent ``git-receive-pack``.
"""

from __future__ import annotations

import difflib
import stat
import time
from pathlib import Path
from types import TracebackType

from dulwich.diff_tree import tree_changes
from dulwich.graph import can_fast_forward, find_merge_base
from dulwich.merge import Merger, three_way_merge
from dulwich.objects import Blob, Commit, ObjectID, ShaFile, Tag, Tree
from dulwich.objectspec import parse_commit
from dulwich.refs import Ref
from dulwich.repo import Repo

EMULATOR_IDENTITY = b"Emulator <emulator@example.com>"
FILE_MODE = 0o100644


class _FileLevelMerger(Merger):
    """dulwich's merger, which merges lines within a file only when the optional
    ``merge3`` package is installed; without it, a file both sides changed differently
    is a conflict (GitHub would merge edits to distinct lines of it)."""

    def merge_blobs(
        self,
        base_blob: Blob | None,
        ours_blob: Blob | None,
        theirs_blob: Blob | None,
        path: bytes | None = None,
    ) -> tuple[bytes, bool]:
        try:
            return super().merge_blobs(base_blob, ours_blob, theirs_blob, path)
        except ImportError:
            return (ours_blob.as_raw_string() if ours_blob else b""), True


def init_bare(path: Path, default_branch: str) -> None:
    """An empty bare repository whose HEAD names ``default_branch``.

    A repository already on disk (its record lost with an older state file) is kept:
    git data is never thrown away by the emulator.
    """
    if (path / "HEAD").exists():
        return
    path.mkdir(parents=True, exist_ok=True)
    Repo.init_bare(str(path), default_branch=default_branch.encode()).close()


def oid(sha: str) -> ObjectID:
    return ObjectID(sha.encode("ascii"))


def ref(name: str) -> Ref:
    return Ref(name.encode())


class GitRepo:
    """One bare repository, opened for the duration of one request."""

    def __init__(self, path: Path) -> None:
        self.repo = Repo(str(path))

    def __enter__(self) -> GitRepo:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.repo.close()

    # -- refs ------------------------------------------------------------------------------

    def ref(self, name: str) -> str | None:
        """The sha a full ref name (``refs/heads/main``) points at, or None."""
        value = self.repo.refs.as_dict().get(ref(name))
        return value.decode() if value is not None else None

    def refs(self, prefix: str = "refs/") -> dict[str, str]:
        """Every ref under ``prefix`` (full names), sorted by name."""
        found = {
            name.decode(): sha.decode()
            for name, sha in self.repo.refs.as_dict().items()
            if name.startswith(prefix.encode()) and name.startswith(b"refs/")
        }
        return dict(sorted(found.items()))

    def branches(self) -> dict[str, str]:
        return {
            name.removeprefix("refs/heads/"): sha for name, sha in self.refs("refs/heads/").items()
        }

    def create_ref(self, name: str, sha: str) -> bool:
        return self.repo.refs.add_if_new(ref(name), oid(sha))

    def update_ref(self, name: str, old: str | None, new: str) -> bool:
        """Move ``name`` from ``old`` to ``new``; False if it no longer points at ``old``."""
        return self.repo.refs.set_if_equals(ref(name), oid(old) if old else None, oid(new))

    def delete_ref(self, name: str, old: str) -> bool:
        return self.repo.refs.remove_if_equals(ref(name), oid(old))

    # -- objects ---------------------------------------------------------------------------

    def exists(self, sha: str) -> bool:
        return len(sha) == 40 and oid(sha) in self.repo.object_store

    def object_type(self, sha: str) -> str:
        return self.repo[oid(sha)].type_name.decode()

    def resolve(self, commitish: str) -> Commit | None:
        """A commit named by sha (or its prefix), branch, tag or full ref, or None."""
        try:
            return parse_commit(self.repo, commitish.encode())
        except (KeyError, ValueError):
            return None

    def commit(self, sha: str) -> Commit:
        found = self.repo[oid(sha)]
        while isinstance(found, Tag):
            found = self.repo[found.object[1]]
        if not isinstance(found, Commit):
            raise KeyError(sha)
        return found

    def is_ancestor(self, ancestor: str, descendant: str) -> bool:
        return can_fast_forward(self.repo, oid(ancestor), oid(descendant))

    def commits_between(self, base: str, head: str) -> list[Commit]:
        """Commits reachable from ``head`` but not from ``base``, oldest first."""
        walker = self.repo.get_walker(include=[oid(head)], exclude=[oid(base)], reverse=True)
        return [entry.commit for entry in walker]

    def diff_stats(self, base: str, head: str) -> tuple[int, int, int]:
        """(changed files, added lines, deleted lines) from the merge base to ``head``."""
        bases = find_merge_base(self.repo, [oid(base), oid(head)])
        old_tree = self.commit(bases[0].decode()).tree if bases else None
        files = additions = deletions = 0
        for change in tree_changes(self.repo.object_store, old_tree, self.commit(head).tree):
            files += 1
            old = self._lines(change.old.sha if change.old else None)
            new = self._lines(change.new.sha if change.new else None)
            for line in difflib.unified_diff(old, new, lineterm="", n=0):
                if line.startswith("+") and not line.startswith("+++"):
                    additions += 1
                elif line.startswith("-") and not line.startswith("---"):
                    deletions += 1
        return files, additions, deletions

    def _lines(self, sha: ObjectID | None) -> list[str]:
        if sha is None:
            return []
        blob = self.repo[sha]
        data = blob.as_raw_string() if isinstance(blob, Blob) else b""
        if b"\0" in data[:8000]:  # binary: git counts no lines either
            return []
        return data.decode(errors="replace").splitlines()

    def entry(self, commit_sha: str, path: str) -> tuple[int, ShaFile] | None:
        """The object at ``path`` in a commit's tree (the root tree for ""), with its mode."""
        tree_id = self.commit(commit_sha).tree
        if not path:
            return stat.S_IFDIR, self.repo[tree_id]
        try:
            mode, sha = self.repo[tree_id].lookup_path(self.repo.__getitem__, path.encode())  # type: ignore[attr-defined]
        except KeyError:
            return None
        if stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode):
            return mode, self.repo[sha]
        return None  # a submodule: nothing stored here to show

    def tree_entries(self, tree: Tree) -> list[tuple[str, int, ShaFile]]:
        return [(e.path.decode(), e.mode, self.repo[e.sha]) for e in tree.items()]

    # -- writing ---------------------------------------------------------------------------

    def write_path(self, parent: str | None, path: str, data: bytes | None) -> ObjectID:
        """A new root tree: ``parent``'s tree with ``path`` set to ``data`` (None removes it).

        Returns the new tree's id; the blob and every tree along the path are stored.
        """
        blob_entry: tuple[int, ObjectID] | None = None
        if data is not None:
            blob = Blob.from_string(data)
            self.repo.object_store.add_object(blob)
            blob_entry = (FILE_MODE, blob.id)
        root = self.commit(parent).tree if parent else None
        parts = [p.encode() for p in path.split("/") if p]
        return self._put(root, parts, blob_entry, top=True) or self._empty_tree()

    def _put(
        self,
        tree_id: ObjectID | None,
        parts: list[bytes],
        entry: tuple[int, ObjectID] | None,
        *,
        top: bool = False,
    ) -> ObjectID | None:
        tree = Tree()
        if tree_id is not None:
            for item in self.repo[tree_id].items():  # type: ignore[attr-defined]
                tree.add(item.path, item.mode, item.sha)
        name, rest = parts[0], parts[1:]
        if rest:
            below = tree[name][1] if name in tree and stat.S_ISDIR(tree[name][0]) else None
            new: tuple[int, ObjectID] | None = None
            if (sub := self._put(below, rest, entry)) is not None:
                new = (stat.S_IFDIR, sub)
        else:
            new = entry
        if new is None:
            if name in tree:
                del tree[name]
        else:
            tree[name] = new
        if not tree.items() and not top:
            return None  # git has no empty directories
        self.repo.object_store.add_object(tree)
        return tree.id

    def _empty_tree(self) -> ObjectID:
        tree = Tree()
        self.repo.object_store.add_object(tree)
        return tree.id

    def new_commit(
        self,
        tree: ObjectID,
        parents: list[str],
        message: str,
        author: bytes = EMULATOR_IDENTITY,
        committer: bytes = EMULATOR_IDENTITY,
    ) -> str:
        commit = Commit()
        commit.tree = tree
        commit.parents = [oid(p) for p in parents]
        commit.author = author
        commit.committer = committer
        commit.commit_time = commit.author_time = int(time.time())
        commit.commit_timezone = commit.author_timezone = 0
        commit.message = message.encode() if message.endswith("\n") else f"{message}\n".encode()
        self.repo.object_store.add_object(commit)
        return commit.id.decode()

    def merged_tree(self, base: str, head: str) -> ObjectID | None:
        """The tree of merging ``head`` into ``base``, or None when they conflict."""
        if self.is_ancestor(base, head):
            return ObjectID(self.commit(head).tree)
        bases = find_merge_base(self.repo, [oid(base), oid(head)])
        ancestor = self.commit(bases[0].decode()) if bases else None
        store = self.repo.object_store
        tree, conflicts = three_way_merge(
            store, ancestor, self.commit(base), self.commit(head), merger=_FileLevelMerger(store)
        )
        if conflicts:
            return None
        self.repo.object_store.add_object(tree)
        return tree.id
