"""``sidecar exec``: run an unmodified agent command as one attempt of a task.

1. ask the running sidecar (control API) for its proxy address and CA bundle;
2. claim the task - a new attempt and generation - waiting for a live lease if asked;
3. start the command with ``HTTP(S)_PROXY=http://TASK:ATTEMPT@proxy`` (the credentials
   tell the proxy which attempt each request acts for) and the combined CA bundle in
   every variable some client reads;
   and the task's last checkpoint (``SIDECAR_LAST_STAGE``, ``SIDECAR_LAST_CHECKPOINT``);
4. heartbeat while it runs; if the lease is lost to another worker, stop the command
   (its writes are refused by the proxy anyway);
5. release the lease when it exits, saying how it ended (kept with the attempt), and
   exit with its status (127 for a command that does not exist, as shells do).

Unless ``quiet``, it says on stderr, one ``sidecar exec:`` line each, what it claimed,
whom it waits for, and how the attempt ended with the effects it recorded, replayed,
had refused and left blocked.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from sidecar.domain.model import AgentExit, Checkpoint
from sidecar.errors import LeaseHeld, SidecarError, SidecarUnreachable
from sidecar.leasekeeper import ControlLeases, Held, LeaseKeeper
from sidecar.trust import TRUST_VARIABLES

log = logging.getLogger("sidecar.exec")

LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: the task goes on elsewhere; this attempt must stop
NOT_FOUND_EXIT = 127  # as shells exit for a command that does not exist
NOT_EXECUTABLE_EXIT = 126  # ... and for one that exists but cannot be run
GRACE_S = 5.0
WAIT_NOTE_EVERY_S = 4.0  # while waiting for a held lease: one line at most this often
SHOWN_REFUSALS = 5  # refusals whose problem text the summary quotes
SUMMARY_PAGES = 40  # pages of 500 effects the summary reads at most
SUMMARY_BUDGET_S = 10.0  # ... and for at most this long
PREFIX = "sidecar exec: "
LEASE_OPERATIONS = frozenset({"claim", "heartbeat", "release"})


class Notes:
    """The ``sidecar exec:`` lines on stderr; ``quiet`` silences them."""

    def __init__(self, quiet: bool = False, stream: TextIO | None = None) -> None:
        self.quiet = quiet
        self.stream = stream
        self._last_wait = -WAIT_NOTE_EVERY_S

    def say(self, text: str) -> None:
        if not self.quiet:
            print(PREFIX + text, file=self.stream or sys.stderr, flush=True)

    def waiting(self, held: LeaseHeld, left_s: float) -> None:
        now = time.monotonic()
        if now - self._last_wait < WAIT_NOTE_EVERY_S:
            return
        self._last_wait = now
        self.say(
            f"task {held.task} is held by worker {held.holder} (attempt {held.attempt_id}) "
            f"until {held.expires_at.isoformat(timespec='seconds')}; waiting "
            f"(up to {left_s:.0f}s more)"
        )


def claim_line(held: Held, worker: str) -> str:
    last = held.last_checkpoint
    stage = "none" if last is None else f"{last.stage} (seq {last.seq})"
    return (
        f"claimed task {held.task}: attempt {held.attempt_id}, generation {held.generation}, "
        f"worker {worker}, last checkpoint {stage}"
    )


def write_last_checkpoint(folder: Path, last: Checkpoint | None) -> str:
    """The file ``SIDECAR_LAST_CHECKPOINT`` names (``""`` when there is no checkpoint):
    the checkpoint's outputs with its seq, stage, generation and attempt, readable by the
    owner only."""
    if last is None:
        return ""
    path = folder / "last_checkpoint.json"
    document = {
        "task": last.task,
        "seq": last.seq,
        "stage": last.stage,
        "generation": last.generation,
        "attempt_id": last.attempt_id,
        "created_at": last.created_at.isoformat(),
        "outputs": last.outputs,
    }
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(document, out)
    return str(path)


def agent_environment(
    base: dict[str, str],
    proxy_url: str,
    bundle: str,
    held: Held,
    checkpoint_file: str = "",
) -> dict[str, str]:
    """The child's environment: proxy with credentials, trust bundle, task identity, and
    where it resumes (its last checkpoint's stage and a file holding the checkpoint)."""
    parts = urlsplit(proxy_url)
    userinfo = f"{quote(held.task, safe='')}:{quote(held.attempt_id, safe='')}"
    with_credentials = urlunsplit((parts.scheme, f"{userinfo}@{parts.netloc}", parts.path, "", ""))
    env = dict(base)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = with_credentials
    env.update(dict.fromkeys(TRUST_VARIABLES, bundle))
    # git's default proxy auth method ("anyauth") waits for a 407 challenge before it
    # sends credentials; the proxy never challenges, so have git send them up front.
    env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
    # libpq clients (psql, psycopg, ...) send PGOPTIONS at start-up: the PostgreSQL relay
    # reads the attempt from it (and removes it) as the HTTP proxy reads its credentials.
    binding = f"-c sidecar.task={held.task} -c sidecar.attempt={held.attempt_id}"
    env["PGOPTIONS"] = f"{base['PGOPTIONS']} {binding}" if base.get("PGOPTIONS") else binding
    env.update(
        SIDECAR_TASK=held.task,
        SIDECAR_ATTEMPT_ID=held.attempt_id,
        SIDECAR_GENERATION=str(held.generation),
        SIDECAR_LAST_STAGE=held.last_checkpoint.stage if held.last_checkpoint else "",
        SIDECAR_LAST_CHECKPOINT=checkpoint_file,
    )
    return env


def exit_of(status: int) -> AgentExit:
    """How a child ended, from its ``returncode`` (negative: the signal that killed it)."""
    if status >= 0:
        return AgentExit(exit_code=status)
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"SIG{-status}"
    return AgentExit(signal=name)


def not_started(error: OSError) -> AgentExit:
    """Why a command could not be started, with the status a shell would exit with."""
    if isinstance(error, FileNotFoundError) or error.errno == errno.ENOENT:
        return AgentExit(exit_code=NOT_FOUND_EXIT, error="command not found")
    if isinstance(error, PermissionError):
        return AgentExit(exit_code=NOT_EXECUTABLE_EXIT, error="permission denied")
    return AgentExit(exit_code=NOT_EXECUTABLE_EXIT, error="cannot be started")


async def run(
    command: Sequence[str],
    *,
    control_url: str,
    token: str | None,
    task: str,
    worker: str,
    ttl_s: float,
    wait_s: float,
    notes: Notes | None = None,
) -> int:
    notes = notes or Notes()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        info = await _proxy_info(session, control_url)
        keeper = LeaseKeeper(ControlLeases(session, control_url), task, worker, ttl_s)
        held = await keeper.acquire(wait_s, notes.waiting)
        notes.say(claim_line(held, worker))
        # Private (0700) and removed after: the checkpoint's outputs may be sensitive.
        with tempfile.TemporaryDirectory(prefix="sidecar-exec-") as private:
            checkpoint_file = write_last_checkpoint(Path(private), held.last_checkpoint)
            env = agent_environment(
                dict(os.environ), info["proxy_url"], info["ca_bundle"], held, checkpoint_file
            )
            end, code = await _run_agent(command, env, keeper, held)
        await keeper.release(end)
        await _summarise(notes, session, control_url, held, end)
        return code


async def _run_agent(
    command: Sequence[str], env: dict[str, str], keeper: LeaseKeeper, held: Held
) -> tuple[AgentExit, int]:
    """Run the agent to its end; how it ended and the status to exit with."""
    task = held.task
    try:
        child = await asyncio.create_subprocess_exec(*command, env=env)
    except OSError as error:
        end = not_started(error)
        print(
            f"{PREFIX}{command[0]}: {end.error} ({error.strerror or error})",
            file=sys.stderr,
            flush=True,
        )
        assert end.exit_code is not None
        return end, end.exit_code
    log.info(
        "agent started",
        extra={
            "task": task,
            "attempt_id": held.attempt_id,
            "generation": held.generation,
            "pid": child.pid,
        },
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, _forward, child, sig)
    heartbeats = asyncio.create_task(keeper.keep(), name=f"heartbeat:{task}")
    exited = asyncio.create_task(child.wait(), name="agent")
    await asyncio.wait({heartbeats, exited}, return_when=asyncio.FIRST_COMPLETED)
    if not exited.done():
        # The heartbeat loop only ends when the lease was lost to another worker.
        log.error("stopping the agent: its lease was lost", extra={"task": task})
        await _stop(child)
        await exited
    heartbeats.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await heartbeats
    status = exited.result()
    end = exit_of(status)
    if keeper.lost is not None:
        return replace(end, lease_lost=True), LEASE_LOST_EXIT
    return end, 128 - status if status < 0 else status


def _forward(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(sig)


async def _stop(child: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()


async def _proxy_info(session: aiohttp.ClientSession, control_url: str) -> dict[str, Any]:
    url = f"{control_url.rstrip('/')}/v1/proxy"
    try:
        async with session.get(url) as response:
            data: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise SidecarUnreachable(
            f"no sidecar answers at {control_url} ({error}); start one with `sidecar serve`"
        ) from error
    if response.status != 200:
        raise SidecarError(f"{url}: {data.get('detail', response.status)}")
    return data


@dataclass
class AttemptEffects:
    """What one attempt did to the outside world, from the task's audit trail."""

    recorded: int = 0  # effects it recorded (and forwarded)
    replayed: int = 0  # answered from the log (replayed, or found by a probe)
    refused: int = 0  # writes refused: fenced, or a replay rejected for a payload change
    blocked: int = 0  # effects it touched that are left unknown (a probe or a human decides)
    problems: list[str] = field(default_factory=list)  # the refusals' problem texts
    partial: bool = False  # the log was longer than the summary reads

    def add_effects(self, effects: list[dict[str, Any]], attempt_id: str) -> None:
        """Count one page of ``GET /v1/tasks/{task}/effects``."""
        for effect in effects:
            mine = [e for e in effect.get("events", []) if e.get("attempt_id") == attempt_id]
            for event in mine:
                name, detail = event.get("event"), event.get("detail")
                if name == "pending":
                    self.recorded += 1
                elif name in ("replayed", "probed"):
                    self.replayed += 1
                elif name == "divergent" and str(detail or "").startswith("rejected"):
                    self.refused += 1
                    self.problems.append(f"{effect.get('key')}: {detail}")
            if mine and effect.get("state") == "unknown":
                self.blocked += 1

    def add_refusals(self, refused_writes: list[dict[str, Any]], attempt_id: str) -> None:
        """Count the fenced writes of ``GET /v1/tasks/{task}``'s ``refused_writes``: the
        agent's (effects, checkpoints), not exec's own lease keeping - a lost lease says
        so in the end, and its refused heartbeat and release would only repeat it."""
        for refusal in refused_writes:
            if (
                refusal.get("attempt_id") == attempt_id
                and refusal.get("operation") not in LEASE_OPERATIONS
            ):
                self.refused += 1
                self.problems.append(f"{refusal.get('operation')}: {refusal.get('reason')}")

    def line(self) -> str:
        counts = (
            f"{self.recorded} recorded, {self.replayed} replayed, {self.refused} refused, "
            f"{self.blocked} blocked"
        )
        return counts + (" (of the first effects of a long log)" if self.partial else "")


def end_words(end: AgentExit) -> str:
    """How the agent ended, for the summary line."""
    if end.lease_lost:
        stopped = replace(end, lease_lost=False).describe()
        return f"lease lost (the agent was stopped: {stopped})"
    return end.describe()


async def read_attempt_effects(
    session: aiohttp.ClientSession, control_url: str, held: Held
) -> AttemptEffects:
    """Follow the task's effect log page by page (bounded) and count this attempt's part."""
    base = f"{control_url.rstrip('/')}/v1/tasks/{held.task}"
    tally = AttemptEffects()
    started = time.monotonic()
    cursor: str | None = None
    for page in range(SUMMARY_PAGES):
        params = {"limit": "500"} | ({"cursor": cursor} if cursor else {})
        data = await _get(session, f"{base}/effects", params)
        tally.add_effects(data.get("effects", []), held.attempt_id)
        cursor = data.get("next_cursor")
        if not cursor:
            break
        if page == SUMMARY_PAGES - 1 or time.monotonic() - started > SUMMARY_BUDGET_S:
            tally.partial = True
            break
    task = await _get(session, base, {})
    tally.add_refusals(task.get("refused_writes", []), held.attempt_id)
    return tally


async def _summarise(
    notes: Notes,
    session: aiohttp.ClientSession,
    control_url: str,
    held: Held,
    end: AgentExit,
) -> None:
    if notes.quiet:
        return
    head = f"attempt {held.attempt_id} of task {held.task} ended: {end_words(end)}"
    try:
        tally = await read_attempt_effects(session, control_url, held)
    except SidecarError as error:
        notes.say(f"{head}; its effects could not be read: {error.detail}")
        return
    notes.say(f"{head}; effects: {tally.line()}")
    for problem in tally.problems[:SHOWN_REFUSALS]:
        notes.say(f"refused: {problem}")
    if len(tally.problems) > SHOWN_REFUSALS:
        more = len(tally.problems) - SHOWN_REFUSALS
        notes.say(f"... and {more} more refusals: see `sidecar effects {held.task}`")


async def _get(session: aiohttp.ClientSession, url: str, params: dict[str, str]) -> dict[str, Any]:
    try:
        async with session.get(url, params=params) as response:
            data: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise SidecarUnreachable(f"{url}: {error}") from error
    if response.status != 200:
        raise SidecarError(f"{url}: {data.get('detail', response.status)}")
    return data
