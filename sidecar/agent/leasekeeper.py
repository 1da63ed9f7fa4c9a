"""Holding a task's lease for a worker: claim (waiting if asked), heartbeat, release.

Used by ``sidecar serve --task`` (the sidecar is the worker; it talks to its store) and
by ``sidecar exec`` (the command's child is the worker; it talks to a running sidecar's
control API).  Both speak :class:`LeaseAPI`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import aiohttp

from sidecar.domain.model import AgentExit, Checkpoint
from sidecar.errors import (
    InvalidRequest,
    LeaseHeld,
    NotFound,
    SidecarError,
    SidecarUnreachable,
    StaleGeneration,
    StoreUnavailable,
    TaskIsDone,
    Unauthorized,
)
from sidecar.runtime.clock import Clock, SystemClock

if TYPE_CHECKING:
    # Only the sidecar's own lease (``serve --task``) is held straight from a store: a
    # `sidecar exec` per agent run does not load the store's package (~7% of its import).
    from sidecar.store import Store

log = logging.getLogger("sidecar.lease")

#: longest pause between two claims while waiting for another worker's lease.
WAIT_PAUSE_S = 5.0


@dataclass(frozen=True, slots=True)
class Held:
    task: str
    attempt_id: str
    generation: int
    expires_at: datetime
    #: the task's last checkpoint when the claim was granted (where the attempt resumes).
    last_checkpoint: Checkpoint | None = None


class LeaseAPI(Protocol):
    async def claim(self, task: str, worker: str, ttl_s: float) -> Held: ...
    async def heartbeat(self, held: Held, ttl_s: float) -> Held: ...
    async def release(self, held: Held, end: AgentExit | None = None) -> None: ...


class StoreLeases:
    """Leases straight from a store (the sidecar holding a lease for itself)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(self, task: str, worker: str, ttl_s: float) -> Held:
        c = await self.store.claim(task, worker, ttl_s)
        return Held(task, c.attempt_id, c.generation, c.lease_expires_at, c.last_checkpoint)

    async def heartbeat(self, held: Held, ttl_s: float) -> Held:
        state = await self.store.heartbeat(held.task, held.attempt_id, held.generation, ttl_s)
        assert state.lease is not None  # a successful heartbeat always leaves a lease
        return Held(held.task, held.attempt_id, held.generation, state.lease.expires_at)

    async def release(self, held: Held, end: AgentExit | None = None) -> None:
        await self.store.release(held.task, held.attempt_id, held.generation, end)


class ControlLeases:
    """Leases through a sidecar's control API (for ``sidecar exec``)."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")

    async def _post(self, task: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        url = f"{self.base_url}/v1/tasks/{task}/{verb}"
        try:
            async with self.session.post(url, json=body) as response:
                data: dict[str, Any] = await response.json(content_type=None)
        except (aiohttp.ClientError, OSError, ValueError) as error:
            raise SidecarUnreachable(f"no sidecar answers at {self.base_url} ({error})") from error
        if response.status < 400:
            return data
        raise _problem_to_error(data, response.status)

    async def claim(self, task: str, worker: str, ttl_s: float) -> Held:
        data = await self._post(task, "claim", {"worker": worker, "ttl_s": ttl_s})
        last = data.get("last_checkpoint")
        return Held(
            task,
            data["attempt_id"],
            data["generation"],
            datetime.fromisoformat(data["lease_expires_at"]),
            None
            if last is None
            else Checkpoint(
                task=task,
                seq=last["seq"],
                stage=last["stage"],
                attempt_id=last["attempt_id"],
                generation=last["generation"],
                outputs=last["outputs"],
                created_at=datetime.fromisoformat(last["created_at"]),
            ),
        )

    async def heartbeat(self, held: Held, ttl_s: float) -> Held:
        token = {"attempt_id": held.attempt_id, "generation": held.generation}
        data = await self._post(held.task, "heartbeat", token | {"ttl_s": ttl_s})
        expires = datetime.fromisoformat(data["lease"]["expires_at"])
        return Held(held.task, held.attempt_id, held.generation, expires)

    async def release(self, held: Held, end: AgentExit | None = None) -> None:
        body: dict[str, Any] = {"attempt_id": held.attempt_id, "generation": held.generation}
        if end is not None:
            said: dict[str, Any] = {"exit_code": end.exit_code, "signal": end.signal}
            if end.error is not None:
                said["error"] = end.error
            if end.lease_lost:
                said["lease_lost"] = True
            body["end"] = {k: v for k, v in said.items() if v is not None}
        await self._post(held.task, "release", body)


def _problem_to_error(data: dict[str, Any], status: int) -> SidecarError:
    code = data.get("code")
    detail = str(data.get("detail", f"HTTP {status}"))
    if code == "lease_held":
        return LeaseHeld(
            data["task"],
            data["holder"],
            data["holder_attempt_id"],
            datetime.fromisoformat(data["lease_expires_at"]),
        )
    if code == "stale_generation":
        # The reason alone: StaleGeneration words the rest of the message itself.
        return StaleGeneration(
            data["task"],
            data["attempt_id"],
            data["generation"],
            data["current_generation"],
            str(data.get("reason", detail)),
        )
    if code == "task_done":
        return TaskIsDone(
            str(data.get("task", "")),
            datetime.fromisoformat(data["done_at"]),
            str(data.get("done_by", "")),
            data.get("note"),
        )
    errors: dict[str, type[SidecarError]] = {
        "not_found": NotFound,
        "unauthorized": Unauthorized,
        "invalid_request": InvalidRequest,
    }
    return errors.get(str(code), StoreUnavailable)(detail)


class LeaseKeeper:
    """Keeps one lease: claim, then heartbeat every ``ttl/3`` until stopped or fenced."""

    def __init__(
        self,
        api: LeaseAPI,
        task: str,
        worker: str,
        ttl_s: float,
        *,
        clock: Clock | None = None,
        on_lost: Callable[[StaleGeneration], None] | None = None,
    ) -> None:
        self.api = api
        self.task = task
        self.worker = worker
        self.ttl_s = ttl_s
        self.clock = clock or SystemClock()
        self.on_lost = on_lost
        self.held: Held | None = None
        self.lost: StaleGeneration | None = None

    async def acquire(
        self, wait_s: float = 0.0, on_wait: Callable[[LeaseHeld, float], None] | None = None
    ) -> Held:
        """Claim; while another worker holds the lease, retry until ``wait_s`` has passed.

        ``on_wait(held, seconds_left)`` is called before each pause (pauses last at most
        ``WAIT_PAUSE_S``), so a caller can say who it waits for and until when."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            try:
                self.held = await self.api.claim(self.task, self.worker, self.ttl_s)
            except LeaseHeld as held:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                if on_wait is not None:
                    on_wait(held, left)
                until_free = (held.expires_at - self.clock.now()).total_seconds()
                pause = min(left, max(0.1, until_free + 0.05), WAIT_PAUSE_S)
                log.info(
                    "waiting %.1fs for the lease of %s",
                    pause,
                    held.holder,
                    extra={"task": self.task},
                )
                await asyncio.sleep(pause)
                continue
            log.info(
                "lease acquired",
                extra={
                    "task": self.task,
                    "attempt_id": self.held.attempt_id,
                    "generation": self.held.generation,
                },
            )
            return self.held

    async def keep(self) -> None:
        """Heartbeat until cancelled; stop (and call ``on_lost``) if fenced."""
        assert self.held is not None, "acquire() first"
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                self.held = await self.api.heartbeat(self.held, self.ttl_s)
            except StaleGeneration as fenced:
                self.lost = fenced
                log.error(
                    "lease lost: %s",
                    fenced.detail,
                    extra={
                        "task": self.task,
                        "attempt_id": fenced.attempt_id,
                        "generation": fenced.generation,
                    },
                )
                if self.on_lost is not None:
                    self.on_lost(fenced)
                return
            except SidecarError as error:
                # Transient (store or sidecar unreachable): the next beat may go through;
                # meanwhile the proxy self-fences as the lease runs out.
                log.warning("heartbeat failed: %s", error.detail, extra={"task": self.task})

    async def release(self, end: AgentExit | None = None) -> None:
        """Give the lease up, saying how the agent ended if ``end`` is given.  After the
        lease was lost there is nothing to give up, but ``end`` is still reported: the
        store keeps it with the attempt and refuses the release itself as stale."""
        if self.held is None or (self.lost is not None and end is None):
            return
        try:
            await self.api.release(self.held, end)
        except StaleGeneration as fenced:
            if self.lost is None:
                # Lost while the agent ran, unnoticed between two heartbeats (e.g. the
                # agent ended first, refused as stale): lost all the same.
                log.warning("release refused: %s", fenced.detail, extra={"task": self.task})
                self.lost = fenced
        except SidecarError as error:
            log.warning("release failed: %s", error.detail, extra={"task": self.task})
