"""Group commit: many concurrent writers, one transaction per batch.

Callers queue their work and wait; a lane takes everything that queued up while the
previous batch was committing (up to ``max_batch``) and commits it as ONE transaction, so
one durable flush answers the whole batch, and each caller is answered only after it.
The busier the store, the bigger the batch, with no timer to wait on.  SQLite has one
writer, so one lane; a server store (PostgreSQL) runs a few lanes on pooled connections.

:class:`GroupCommitStore` is the write side of a store built on it (both SQL stores): each
command, and each check that the store is writable, is queued and answered after its
batch's commit.

One caller's bad value must not fail the others (SPEC §7): a batch that fails with
:class:`~sidecar.errors.UnstorableValue` is committed again one work at a time, so only
the work that carries the value is refused (422) and every other one is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from sidecar.errors import SidecarError, StoreUnavailable, UnstorableValue
from sidecar.runtime.aio import spawn
from sidecar.store.base import Store
from sidecar.store.batch import Probe, Work
from sidecar.store.commands import Command

log = logging.getLogger(__name__)

type CommitBatch = Callable[[list[Work]], Awaitable[list[Any]]]
type _Job = tuple[Work, asyncio.Future[Any]]


class GroupCommit:
    """The write queue of one store and the lanes that drain it."""

    def __init__(
        self,
        commit: CommitBatch,
        *,
        name: str,
        lanes: int = 1,
        max_batch: int = 256,
    ) -> None:
        self._commit = commit
        self._name = name
        self._lanes = lanes
        self._max_batch = max_batch
        self._waiting: deque[_Job] = deque()
        self._work_arrived = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def running(self) -> bool:
        return bool(self._tasks) and not self._stopping

    def start(self) -> None:
        self._stopping = False
        self._tasks = [
            spawn(self._lane(), name=f"{self._name}:lane{i}") for i in range(self._lanes)
        ]

    async def stop(self) -> None:
        """Commit what is queued, then stop the lanes."""
        self._stopping = True
        self._work_arrived.set()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            await task

    def submit(self, work: Work) -> asyncio.Future[Any]:
        """Queue ``work`` now; the future of its outcome, set once the batch holding it is
        committed.  A plain function returning the future, not a coroutine: every write
        awaits it, and a coroutine in between is one more frame to create and resume per
        write (bench/control_api.py)."""
        if not self.running:
            raise StoreUnavailable(f"the store {self._name} is not open")
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((work, future))
        self._work_arrived.set()
        return future

    async def _lane(self) -> None:
        while self._waiting or not self._stopping:
            if not self._waiting:
                self._work_arrived.clear()
                await self._work_arrived.wait()
                continue
            jobs = [
                self._waiting.popleft() for _ in range(min(self._max_batch, len(self._waiting)))
            ]
            if self._waiting:
                self._work_arrived.set()  # more than one batch waits: wake another lane
            await self._run_batch(jobs)

    async def _run_batch(self, jobs: list[_Job]) -> None:
        try:
            outcomes = await self._commit([w for w, _ in jobs])
        except UnstorableValue as poisoned:
            await self._isolate(jobs, poisoned)
            return
        except BaseException as exc:
            # Nothing of the batch was committed: every caller learns it, none hangs.
            if isinstance(exc, Exception) and not isinstance(exc, SidecarError):
                log.error("%s: batch of %d failed", self._name, len(jobs), exc_info=exc)
            failure = (
                exc
                if isinstance(exc, SidecarError)
                else StoreUnavailable(f"{self._name}: write failed: {exc}")
            )
            for _, future in jobs:
                if not future.done():
                    future.set_exception(failure)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), outcome in zip(jobs, outcomes, strict=True):
            if future.done():
                continue  # the caller went away; its write is committed regardless
            if isinstance(outcome, SidecarError):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    async def _isolate(self, jobs: list[_Job], poisoned: UnstorableValue) -> None:
        """A batch failed on a value the store cannot hold: commit its works one by one,
        so that only the one carrying the value is refused."""
        if len(jobs) == 1:
            _, future = jobs[0]
            if not future.done():
                future.set_exception(poisoned)
            return
        log.warning(
            "%s: a batch of %d holds a value the store cannot hold; committing it one "
            "write at a time",
            self._name,
            len(jobs),
        )
        for job in jobs:
            await self._run_batch([job])


class GroupCommitStore(Store):
    """A store whose writes all go through its :class:`GroupCommit` (``_writes``, made
    when it opens for writing): the SQL stores."""

    _writes: GroupCommit | None = None
    #: what a write is refused with while the store is not open for writing.
    _closed: ClassVar[str]

    def _run[T](self, command: Command[T]) -> Awaitable[T]:
        # The queue's future itself, awaited by Store.execute: no coroutine in between.
        return self._submit(command)

    async def check_writable(self) -> None:
        await self._submit(Probe())

    def _submit(self, work: Work) -> asyncio.Future[Any]:
        if self._writes is None:
            raise StoreUnavailable(self._closed)
        return self._writes.submit(work)
