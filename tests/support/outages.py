"""Store outages done to real sidecar processes, and an agent's view through them.

An outage is done to the store from outside the sidecar, then undone:

* :class:`PgServerDown` - the PostgreSQL server is stopped (``pg_ctl stop -m
  immediate``: its processes die as in a crash) and started again on the same port and
  data;
* :class:`SqliteLocked` - another OS process holds ``BEGIN EXCLUSIVE`` on the SQLite
  file (what an operator's ``sqlite3 effects.db`` left open in a transaction does);
* :class:`DiskFull` - the file system holding the SQLite file is filled to the last
  byte, then the filler is deleted.  The file system is a :class:`Volume` of its own: a
  size-limited tmpfs, or a loop-mounted ext4 image where tmpfs cannot be mounted.

    volume = Volume.mount(tmp / "vol", "tmpfs", size_bytes=16 << 20)   # root only
    stack = Stack.start(tmp, rules=[write_rules(tmp)], hosts=HOSTS,
                        sidecar_args=["--store", f"sqlite:///{volume.path}/effects.db"])
    agent = Agent(stack, "312"); agent.claim()
    with outage(DiskFull(volume)):
        refused = agent.create("b")                  # 503 store_unavailable
    ...

:class:`Agent` makes the calls an agent makes - effects and reads through the proxy,
bound with ``X-Sidecar-Task`` - and the calls an orchestrator makes (claim, /readyz),
each timed.  The rules (:data:`RULES`) mark ``POST .../things`` as non-idempotent
effects of the counting upstream (:mod:`sidecar.testing.upstream`), ``POST /effects/ID``
as idempotent and every GET as a read.

Used by tests/acceptance/store/test_store_outage.py.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Protocol

import requests

from sidecar.testing.processes import Child
from tests.support.pgcluster import SUPERUSER, PgCluster
from tests.support.stack import Stack

HOST = "api.things.test"
HOSTS = [HOST]
THINGS = "/repos/acme/app/things"
HELD = "/held/things"

RULES = """\
# tests.support.outages: the counting upstream's things API, as the outage tests see it.
version: 1
rules:
  - name: outage.things.create
    description: Create a thing; the API does not dedupe (non-idempotent), a probe finds it.
    match: {host: api.things.test, method: POST, path: "/repos/{owner}/{repo}/things"}
    effect: non_idempotent
    key: "{owner}/{repo}#thing:{body.name}"
    on_unknown: probe
    timeout_s: 5
    probe:
      request: {method: GET, path: "/repos/{owner}/{repo}/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}

  - name: outage.things.held
    description: The same, on a path whose answer the upstream holds until released.
    match: {host: api.things.test, method: POST, path: /held/things}
    effect: non_idempotent
    key: "held#thing:{body.name}"
    on_unknown: probe
    timeout_s: 3
    probe:
      request: {method: GET, path: "/repos/-/-/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}

  - name: outage.effects.put
    description: Safe to repeat, so passed through untouched.
    match: {host: api.things.test, method: POST, path: "/effects/{id}"}
    effect: idempotent

  - name: outage.reads
    description: Reads pass through untouched.
    match: {host: api.things.test, method: [GET, HEAD]}
    effect: read
"""


def write_rules(directory: Path) -> Path:
    """:data:`RULES` as a file in ``directory``, for ``Stack.start(rules=[...])``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "outage-rules.yaml"
    path.write_text(RULES)
    return path


# ---- an agent's view -------------------------------------------------------------------


@dataclass(frozen=True)
class Reply:
    """One answer, as the agent got it, and how long it took."""

    status: int
    headers: dict[str, str]  # names in lower case
    body: Any  # decoded JSON, else the text
    seconds: float

    @property
    def code(self) -> str | None:
        """The problem+json ``code`` of a refusal."""
        return self.body.get("code") if isinstance(self.body, dict) else None

    @property
    def disposition(self) -> str | None:
        """``X-Sidecar-Effect``: recorded, replayed, probed, refused, ..."""
        return self.headers.get("x-sidecar-effect")


class Agent:
    """Calls through one stack's proxy bound to ``task`` (``X-Sidecar-Task``), and to
    its control API."""

    def __init__(self, stack: Stack, task: str, *, timeout_s: float = 60.0) -> None:
        self.stack = stack
        self.task = task
        self.timeout_s = timeout_s
        self._proxied = requests.Session()
        self._proxied.trust_env = False  # no HTTP(S)_PROXY / NO_PROXY of the machine
        self._proxied.proxies = {"http": stack.proxy_url, "https": stack.proxy_url}
        self._proxied.verify = stack.ca_cert
        self._proxied.headers["X-Sidecar-Task"] = task
        self._direct = requests.Session()
        self._direct.trust_env = False

    def close(self) -> None:
        self._proxied.close()
        self._direct.close()

    # -- through the proxy

    def create(self, name: str) -> Reply:
        """A non-idempotent effect: ``POST /repos/acme/app/things {"name": name}``."""
        return self._call(self._proxied, "POST", f"https://{HOST}{THINGS}", {"name": name})

    def create_held(self, name: str) -> Reply:
        """The same effect on ``/held/things``: the upstream answers when released."""
        return self._call(self._proxied, "POST", f"https://{HOST}{HELD}", {"name": name})

    def read(self, name: str) -> Reply:
        """A read: ``GET /repos/acme/app/things?name=NAME``."""
        return self._call(self._proxied, "GET", f"https://{HOST}{THINGS}?name={name}")

    def put_idempotent(self, ident: str) -> Reply:
        """An idempotent call: ``POST /effects/ID``."""
        return self._call(self._proxied, "POST", f"https://{HOST}/effects/{ident}", {})

    # -- the control API

    def claim(self, ttl_s: float = 600) -> Reply:
        """Claim the task for a worker (a long lease: no heartbeat is needed meanwhile)."""
        url = f"{self.stack.control_url}/v1/tasks/{self.task}/claim"
        claimed = self._call(self._direct, "POST", url, {"worker": "outage", "ttl_s": ttl_s})
        if claimed.status != 200:
            raise RuntimeError(f"claim of task {self.task} refused: {claimed}")
        return claimed

    def readiness(self) -> Reply:
        return self._call(self._direct, "GET", f"{self.stack.control_url}/readyz")

    def wait_readiness(self, ready: bool, timeout_s: float = 30.0) -> float:
        """Poll /readyz until it says ``ready`` (200) or not (503); the seconds it took."""
        started = time.monotonic()
        while True:
            answer = self.readiness()
            if answer.status == (200 if ready else 503):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                state = "ready" if ready else "not ready"
                raise TimeoutError(f"/readyz not {state} within {timeout_s}s: {answer}")
            time.sleep(0.1)

    def effects(self) -> dict[str, dict[str, Any]]:
        """The task's effect log, by effect key, read through the control API."""
        return {e["key"]: e for e in self.stack.effects(self.task)}

    def failed_records(self, key: str) -> list[datetime]:
        """When the sidecar tried to record effect ``key`` and the store could not: its
        ``effect.record refused ... store_unavailable`` log lines, one per try."""
        return [
            datetime.fromisoformat(line["ts"])
            for line in self.stack.log_lines()
            if line.get("operation") == "effect.record"
            and line.get("effect_key") == key
            and line.get("code") == "store_unavailable"
        ]

    def _call(self, session: requests.Session, method: str, url: str, body: Any = None) -> Reply:
        started = time.monotonic()
        response = session.request(method, url, json=body, timeout=self.timeout_s)
        seconds = time.monotonic() - started
        try:
            decoded: Any = response.json()
        except ValueError:
            decoded = response.text
        headers = {name.lower(): value for name, value in response.headers.items()}
        return Reply(response.status_code, headers, decoded, seconds)


def posts(stack: Stack, path: str = THINGS) -> int:
    """How many ``POST path`` requests reached the upstream."""
    found: int = stack.counts()["requests"].get(f"POST {path}", 0)
    return found


def release_held(stack: Stack) -> None:
    """Let the upstream answer every request held on ``/held/things``."""
    requests.post(f"{stack.upstream_url}/_upstream/release", timeout=10).raise_for_status()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s}s")
        time.sleep(0.02)


# ---- outages ---------------------------------------------------------------------------


class Outage(Protocol):
    name: str

    def begin(self) -> None:
        """Make the store unusable; return once it is."""

    def end(self) -> None:
        """Undo :meth:`begin`; return once the store could be used again."""


@contextlib.contextmanager
def outage(what: Outage) -> Iterator[Outage]:
    """``begin()`` … ``end()``, the end also when the body fails."""
    what.begin()
    try:
        yield what
    finally:
        what.end()


def pg_store_url(cluster: PgCluster, database: str = "postgres") -> str:
    """The ``--store`` URL of ``database`` on a private cluster whose ``pg_hba`` trusts
    the superuser over TCP from 127.0.0.1 (see :data:`PG_HBA`)."""
    return f"postgresql://{SUPERUSER}@{cluster.host}:{cluster.port}/{database}?sslmode=disable"


#: pg_hba lines for :func:`pg_store_url`.
PG_HBA = [f"host all {SUPERUSER} 127.0.0.1/32 trust"]
#: A test cluster has ``synchronous_commit = off`` for speed, which loses the last commits
#: on an immediate stop; a store must have it on (the store reports it on /readyz).
PG_DURABLE = {"synchronous_commit": "on"}


@dataclass
class PgServerDown:
    cluster: PgCluster
    name: str = "postgresql server stopped"

    def begin(self) -> None:
        self.cluster.stop_server()

    def end(self) -> None:
        self.cluster.start()


_LOCKER = """\
import signal, sqlite3, sys
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
signal.sigwait({signal.SIGTERM})
db.execute("COMMIT")
db.close()
print("released", flush=True)
"""


@dataclass
class SqliteLocked:
    """Another process holds ``BEGIN EXCLUSIVE`` on ``path`` from ``begin()`` to ``end()``.

    In WAL mode that is the write lock: readers go on, every writer waits for it (the
    store's busy timeout), then gets ``database is locked``.
    """

    path: Path
    log: Path | None = None
    name: str = "sqlite file locked by another process"
    _holder: Child | None = field(default=None, init=False, repr=False)

    def begin(self) -> None:
        self._holder = Child([sys.executable, "-c", _LOCKER, str(self.path)], stderr_path=self.log)
        self._holder.wait_for("^locked$", timeout=60)

    def end(self) -> None:
        if self._holder is not None:
            status = self._holder.terminate()  # SIGTERM: it commits, closes and exits
            self._holder = None
            if status != 0:
                raise RuntimeError(f"the process holding the lock on {self.path} exited {status}")


class CannotMount(RuntimeError):
    """This machine cannot mount a size-limited file system here (and why)."""


type VolumeKind = Literal["tmpfs", "ext4-loop"]


@dataclass
class Volume:
    """A small file system of its own, mounted at ``path`` (root only)."""

    path: Path
    kind: VolumeKind
    image: Path | None = None
    filler_name: str = ".filler"

    @classmethod
    def mount(cls, path: Path, kind: VolumeKind, size_bytes: int = 16 << 20) -> Volume:
        """Mount a ``kind`` file system of ``size_bytes`` at ``path`` (created).

        ``tmpfs``: ``mount -t tmpfs -o size=...``; ``ext4-loop``: an image file next to
        ``path``, ``mkfs.ext4 -m 0`` (no blocks reserved for root: full means full),
        ``mount -o loop``.  Raises :class:`CannotMount` with the reason when this machine
        does not allow it (not root, no CAP_SYS_ADMIN, no loop devices, no tools).
        """
        if os.geteuid() != 0:
            raise CannotMount(f"mounting a {kind} file system needs root")
        path.mkdir(parents=True, exist_ok=True)
        image = None
        if kind == "tmpfs":
            argv = ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs"]
        else:
            if shutil.which("mkfs.ext4") is None:
                raise CannotMount("no mkfs.ext4 to make an ext4 image")
            image = path.with_name(f"{path.name}.img")
            with image.open("wb") as f:
                f.truncate(size_bytes)
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], "mkfs.ext4")
            argv = ["mount", "-o", "loop", str(image)]
        try:
            _run([*argv, str(path)], f"mount ({kind})")
        except CannotMount:
            if image is not None:
                image.unlink(missing_ok=True)
            raise
        return cls(path, kind, image)

    @property
    def filler(self) -> Path:
        return self.path / self.filler_name

    def available(self) -> int:
        """Bytes an unprivileged writer could still write (``statvfs``)."""
        stats = os.statvfs(self.path)
        return stats.f_bavail * stats.f_frsize

    def fill(self) -> int:
        """Write a filler file until the file system refuses one more byte; its size."""
        written = 0
        with self.filler.open("ab", buffering=0) as f:
            for chunk in (1 << 20, 1 << 12, 1):
                block = b"\0" * chunk
                while True:
                    try:
                        written += f.write(block) or 0
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        break
            with contextlib.suppress(OSError):
                os.fsync(f.fileno())
        return written

    def free(self) -> None:
        """Delete the filler: the space is back."""
        self.filler.unlink(missing_ok=True)

    def unmount(self) -> None:
        """Unmount (lazily if something still holds a file there) and delete the image."""
        for argv in (["umount", str(self.path)], ["umount", "-l", str(self.path)]):
            done = subprocess.run(argv, capture_output=True, check=False, timeout=60)
            if done.returncode == 0:
                break
        if self.image is not None:
            self.image.unlink(missing_ok=True)


def _run(argv: list[str], what: str) -> None:
    if shutil.which(argv[0]) is None:
        raise CannotMount(f"{what}: no {argv[0]} on this machine")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise CannotMount(f"{what} refused here: {(done.stderr or done.stdout).strip()}")


@dataclass
class DiskFull:
    """The volume holding the store is full from ``begin()`` until ``end()``."""

    volume: Volume
    name: str = "sqlite volume full"
    filled_bytes: int = 0

    def begin(self) -> None:
        self.filled_bytes = self.volume.fill()

    def end(self) -> None:
        self.volume.free()
