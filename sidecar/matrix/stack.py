"""A cell's private world: its own sidecar (data dir, free ports), and the user's agent
run under ``sidecar exec`` against it as one attempt after another.

The sidecar is a real ``sidecar serve`` process (a
:class:`sidecar.testing.sidecar.SidecarProcess`); a restart after a kill reuses its data
and ports (the agent's next attempt finds it where the last one did).  What the cell
later checks is read from the sidecar itself: its control API (the task, its effects and
audit trail) and its log, whose one ``effect forwarded`` / ``statement forwarded`` line
per request sent is the sidecar's own record of every forward.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from sidecar.errors import SidecarError
from sidecar.testing.processes import Child, ProcessFailed, scratch_env
from sidecar.testing.sidecar import HasSidecar, SidecarProcess

# Every process the cells started, so that an interrupted matrix can stop them all (each
# runs in a session of its own: a Ctrl-C does not reach it).
_started: list[Child] = []
_started_lock = threading.Lock()
_stopping = threading.Event()


def _spawn(argv: list[str], env: dict[str, str], log: Path, cwd: Path | None) -> Child:
    with _started_lock:
        if _stopping.is_set():
            raise SidecarError("the matrix is stopping")
        child = Child(argv, env=env, cwd=cwd, stderr_path=log)
        _started.append(child)
    return child


def kill_everything() -> None:
    """SIGKILL every process group the cells started (thawing frozen ones first)."""
    with _started_lock:
        _stopping.set()
        children = list(_started)
    for child in children:
        if child.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGCONT)
                os.killpg(child.pid, signal.SIGKILL)


FORWARDED = ("effect forwarded", "statement forwarded")


@dataclass(frozen=True, slots=True)
class Setup:
    """What every cell's sidecar and agent are started with (from the command line)."""

    agent: tuple[str, ...]
    rules: tuple[Path, ...] = ()
    routes: tuple[str, ...] = ()
    pg_upstream: str | None = None
    lease_ttl_s: float = 4.0
    extra_env: tuple[tuple[str, str], ...] = ()
    #: a running sidecar to use instead of private ones (``--control``), and its token
    control: str | None = None
    token: str | None = None


@dataclass
class PrivateSidecar(HasSidecar):
    root: Path
    setup: Setup
    process: SidecarProcess = field(init=False)

    def __post_init__(self) -> None:
        pg = server_only(self.setup.pg_upstream) if self.setup.pg_upstream else None
        self.process = SidecarProcess(
            self.data_dir, self.root, self.setup.rules, self.setup.routes, pg,
            spawn=_spawn, token=self.setup.token, timeout_s=15,
        )  # fmt: skip

    @property
    def data_dir(self) -> Path:
        return self.root / "sidecar-data"

    @property
    def store_file(self) -> Path:
        return self.data_dir / "effects.db"

    @property
    def child(self) -> Child | None:
        return self.process.child

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, failpoints: str = "") -> None:
        """Start it (again, on the same data and ports after a kill)."""
        environ = {k: v for k, v in os.environ.items() if k != "SIDECAR_FAILPOINTS"}
        try:
            self.process.start(
                {"SIDECAR_FAILPOINTS": failpoints} if failpoints else {}, environ=environ
            )
        except ProcessFailed as failed:
            raise SidecarError(f"the cell's sidecar did not start: {failed}") from failed

    def stopped(self) -> bool:
        """Whether the sidecar is frozen (it stopped itself at a failpoint)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return False
        return fields[0] in ("T", "t")

    def alive(self) -> bool:
        return self.process.alive()

    def thaw(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def close(self) -> None:
        if self.child is not None and self.stopped():
            self.thaw()
        self.process.terminate(timeout=5)

    # ---- what the sidecar knows ----------------------------------------------------

    def get(self, path: str) -> Any:
        return self.process.get(path)

    def task(self, task: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.get(f"/v1/tasks/{quote(task, safe='')}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise
        return found

    def effects(self, task: str) -> list[dict[str, Any]]:
        """Every effect of ``task`` with its audit trail, in the order they were first
        recorded."""
        found: list[dict[str, Any]] = []
        cursor = ""
        while True:
            try:
                page = self.get(f"/v1/tasks/{quote(task, safe='')}/effects?limit=500{cursor}")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return []  # not claimed yet
                raise
            found += page["effects"]
            if not page.get("next_cursor"):
                break
            cursor = f"&cursor={quote(page['next_cursor'], safe='')}"
        return sorted(found, key=lambda e: str(e["created_at"]))

    def forwards(self, task: str) -> Counter[str] | None:
        """How many times each effect of ``task`` was sent, from the sidecar's logs."""
        sent: Counter[str] = Counter()
        for log in sorted(self.root.glob("sidecar-*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if not line.startswith("{"):
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue  # a line cut off by the SIGKILL
                if entry.get("msg") in FORWARDED and entry.get("task") == task:
                    sent[str(entry.get("effect_key"))] += 1
        return sent

    def log_mentions(self, text: str) -> bool:
        return any(
            text in log.read_text(errors="replace") for log in self.root.glob("sidecar-*.log")
        )


@dataclass
class RunningSidecar(PrivateSidecar):
    """The sidecar ``--control`` names: already running, not ours to kill, freeze or
    arm, its log and store out of reach; its control API is all a cell has."""

    def start(self, failpoints: str = "") -> None:
        assert not failpoints, "a running sidecar cannot be armed"
        assert self.setup.control is not None
        self.process.control = self.setup.control
        self.get("/readyz")  # answers, and with this token

    def stopped(self) -> bool:
        return False

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        pass

    def forwards(self, task: str) -> Counter[str] | None:
        return None  # its log is not ours to read

    def log_mentions(self, text: str) -> bool:
        return False


def cell_sidecar(root: Path, setup: Setup) -> PrivateSidecar:
    """The sidecar a cell runs against: its own, or the running one ``--control`` names."""
    return RunningSidecar(root, setup) if setup.control else PrivateSidecar(root, setup)


@dataclass
class Attempts:
    """The user's agent run as attempts of one task, each under its own worker name."""

    sidecar: PrivateSidecar
    task: str
    runs: list[Child] = field(default_factory=list)

    def start(self, *, wait_s: float = 0.0) -> Child:
        setup, sidecar = self.sidecar.setup, self.sidecar
        n = len(self.runs) + 1
        # TMPDIR in the cell's directory, unless the setup sets one: an attempt killed on
        # purpose leaves its temporary files with the cell's logs.
        env = scratch_env(sidecar.root) | dict(setup.extra_env)
        env["SIDECAR_MATRIX_TASK"] = self.task
        if setup.token:
            env["SIDECAR_CONTROL_TOKEN"] = setup.token
        if sidecar.pg:
            env["SIDECAR_PG_URL"] = sidecar.pg
            if setup.pg_upstream:
                env["DATABASE_URL"] = through_relay(setup.pg_upstream, sidecar.pg)
        run = sidecar.process.exec_agent(
            self.task, f"worker-{n}", setup.agent, ttl_s=setup.lease_ttl_s, wait_s=wait_s,
            env=env, log=sidecar.root / f"attempt-{n}.log",
        )  # fmt: skip
        self.runs.append(run)
        return run

    def finish(self, *, timeout_s: float, attempts: int = 30) -> tuple[int | None, str]:
        """Run attempts, as a supervisor restarts a failed agent (with a growing pause),
        until one exits 0, an effect waits for a human, or ``timeout_s`` has passed.
        Returns the last exit status and why it stopped.  (An effect whose first try may
        still land makes attempts fail until its settle time is over: that is the product
        refusing to guess, so the cell waits it out.)"""
        deadline = time.monotonic() + timeout_s
        status: int | None = None
        pause = 0.5
        for _ in range(attempts):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            run = self.start(wait_s=min(left, 3 * self.sidecar.setup.lease_ttl_s + 60))
            try:
                status = run.wait(timeout=left)
            except subprocess.TimeoutExpired:
                run.kill_group()
                return None, f"attempt {len(self.runs)} did not end within {timeout_s:g}s"
            if status == 0:
                return 0, "finished"
            if self.blocked():
                return status, "an effect waits for a human"
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, 10.0)
        return status, f"{len(self.runs)} attempts did not finish (last exit {status})"

    def blocked(self) -> list[dict[str, Any]]:
        """The task's effects that wait for a human (CANNOT DETERMINE)."""
        return [
            effect
            for effect in self.sidecar.effects(self.task)
            if effect["state"] == "unknown"
            and any(event["event"] == "blocked" for event in effect["events"])
        ]

    def kill_all(self) -> None:
        for run in self.runs:
            run.end()


def through_relay(upstream: str, relay: str) -> str:
    """The user's database URL with the relay's address in place of the server's."""
    parts, at = urlsplit(upstream), urlsplit(relay).netloc
    user = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{user}@{at}" if user else at))


def server_only(url: str) -> str:
    """The server part of the user's database URL, as ``serve --pg-upstream`` takes it:
    the agent authenticates itself, so no user, password or database."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], "", parts.query, ""))
