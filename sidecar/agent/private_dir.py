"""The private directory of one ``sidecar exec``, and the sweep of those a killed one left.

``sidecar exec`` keeps what the agent reads from files there, mode 0700: the task's last
checkpoint (its outputs may be sensitive), the Java trust store, an isolated agent's
``hosts`` and ``resolv.conf``; it removes the directory when the agent ends.  An exec
killed with SIGKILL cannot, and agents are killed: that is what the sidecar is for.  So
the directory's name says whose it is - the pid namespace, the pid and the start time of
the exec that made it - and every ``sidecar exec`` first removes the directories of its
user whose exec is gone.

A directory is removed only when all of these hold: its name is of this form, it is a
directory (not a link) owned by this user, it was made in this pid namespace (another
container sharing the temporary directory cannot be judged from here), and no process
with that pid and that start time is running (a pid given to another process since does
not keep it, nor does a new process under the old pid save it).  Where ``/proc`` cannot
tell (not Linux), directories get the plain prefix and nothing is swept.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("sidecar.exec")

PREFIX = "sidecar-exec-"
_OURS = re.compile(rf"^{PREFIX}(\d+)-(\d+)-(\d+)-")


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot), None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces and parentheses, so count
    # from the last ")".
    return int(stat.rsplit(")", 1)[1].split()[19])


def _prefix() -> str:
    namespace, started = _pid_namespace(), _started(os.getpid())
    if namespace is None or started is None:
        return PREFIX
    return f"{PREFIX}{namespace}-{os.getpid()}-{started}-"


@contextlib.contextmanager
def private_dir() -> Iterator[Path]:
    """A new directory (0700) named for this process, removed when the block ends."""
    with tempfile.TemporaryDirectory(prefix=_prefix()) as made:
        yield Path(made)


def sweep(root: Path | None = None) -> list[Path]:
    """Remove the private directories in ``root`` (the temporary directory) whose exec is
    gone; return them.  One that cannot be removed is logged and left."""
    namespace = _pid_namespace()
    if namespace is None:
        return []
    removed = []
    uid = os.getuid()
    folder = Path(tempfile.gettempdir()) if root is None else root
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        found = _OURS.match(entry.name)
        if found is None or int(found.group(1)) != namespace:
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat().st_uid != uid:
                continue
        except OSError:
            continue
        pid, started = int(found.group(2)), int(found.group(3))
        if _started(pid) == started:
            continue  # its exec is still running
        try:
            shutil.rmtree(entry.path)
        except OSError as error:
            log.warning(
                "cannot remove %s, left by a sidecar exec that ended: %s", entry.path, error
            )
            continue
        removed.append(Path(entry.path))
    return removed
