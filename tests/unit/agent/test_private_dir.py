"""The private directories of `sidecar exec`: named for their exec, swept when it is gone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.agent import private_dir
from sidecar.agent.private_dir import PREFIX, sweep

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc tells who is alive")


def namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def started(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def a_process_that_ended() -> tuple[int, int]:
    """The pid and start time of a real process, killed and reaped."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    when = started(child.pid)
    child.kill()
    child.wait()
    return child.pid, when


def made(root: Path, ns: int, pid: int, start: int, tail: str = "abc") -> Path:
    folder = root / f"{PREFIX}{ns}-{pid}-{start}-{tail}"
    folder.mkdir(mode=0o700)
    (folder / "last_checkpoint.json").write_text('{"outputs": {"secret": "s"}}')
    return folder


def test_a_directory_whose_exec_is_gone_is_removed_and_the_others_are_kept(tmp_path: Path):
    ns, me = namespace(), os.getpid()
    dead_pid, dead_start = a_process_that_ended()
    orphan = made(tmp_path, ns, dead_pid, dead_start)
    # The pid now belongs to another process (here: this one): not the exec that made it.
    reused = made(tmp_path, ns, me, started(me) + 1, "reused")
    live = made(tmp_path, ns, me, started(me), "live")
    elsewhere = made(tmp_path, ns + 1, dead_pid, dead_start, "other-namespace")
    older = tmp_path / f"{PREFIX}k2x8q0zz"  # the name before this one: whose is unknown
    older.mkdir()
    a_file = tmp_path / f"{PREFIX}{ns}-{dead_pid}-{dead_start}-file"
    a_file.write_text("not a directory")
    target = tmp_path / "target"
    target.mkdir()
    link = tmp_path / f"{PREFIX}{ns}-{dead_pid}-{dead_start}-link"
    link.symlink_to(target)

    removed = sweep(tmp_path)

    assert sorted(removed) == sorted([orphan, reused])
    assert not orphan.exists()
    assert not reused.exists()
    for kept in (live, elsewhere, older, a_file, link, target):
        assert kept.exists(), kept


def test_another_users_directory_is_kept(tmp_path: Path):
    if os.getuid() != 0:
        return  # only root can make a directory another user owns; nothing to sweep then
    dead_pid, dead_start = a_process_that_ended()
    theirs = made(tmp_path, namespace(), dead_pid, dead_start)
    os.chown(theirs, 65534, 65534)
    assert sweep(tmp_path) == []
    assert theirs.exists()


def test_the_private_directory_is_named_for_this_exec_private_and_removed_after(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with private_dir.private_dir() as folder:
        assert folder.parent == tmp_path
        assert folder.name.startswith(
            f"{PREFIX}{namespace()}-{os.getpid()}-{started(os.getpid())}-"
        )
        assert folder.stat().st_mode & 0o777 == 0o700
        assert sweep(tmp_path) == []  # its exec is running
        assert folder.exists()
    assert not folder.exists()
