"""Which task, attempt and generation an effect acts for, and whether it still may.

What a protocol tells (a :class:`BindRequest`) is resolved here, the same for HTTP and
SQL.  An HTTP request is bound by, in order of precedence:

1. the proxy credentials of its connection, ``http://TASK:ATTEMPT_ID@sidecar:port``, which
   ``sidecar exec`` puts in ``HTTP(S)_PROXY``: the attempt is pinned, so a worker that
   lost its lease is fenced even while a newer attempt of the same task runs;
2. an ``X-Sidecar-Task: TASK`` header (stripped before forwarding): the task's current
   attempt as this sidecar knows it;
3. the sidecar's configured ``--task``.

A PostgreSQL connection is bound by its startup options (``-c sidecar.task=T -c
sidecar.attempt=A``, which ``sidecar exec`` puts in ``PGOPTIONS``), else the ``--task``.

:class:`Bindings` follows every claim, heartbeat and release written through this
sidecar's store (it is a store observer), so it knows leases granted through its control
API without asking; what it does not know it reads from the store.  It also implements
self-fencing (SPEC §3.5a): a lease within its safety margin of expiry, not renewed, stops
matched writes before the store would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sidecar.domain.model import Claim, TaskState
from sidecar.errors import LeaseExpiring, NotFound, SidecarError, StaleGeneration, TaskUnbound
from sidecar.runtime.clock import Clock
from sidecar.store import Store, WriteObserver
from sidecar.store.commands import Command, Heartbeat, Release


@dataclass(frozen=True, slots=True)
class BindRequest:
    """What a request or connection says it acts for, before it is resolved."""

    task: str | None
    attempt_id: str | None
    source: str = "default"  # "credentials" | "header" | "default" | "pg" | "none"


@dataclass(frozen=True, slots=True)
class Binding:
    task: str
    attempt_id: str
    generation: int
    worker: str
    lease_expires_at: datetime
    ttl_s: float
    source: str  # "credentials" | "header" | "default"

    def via(self, source: str) -> Binding:
        """This binding as resolved by ``source`` (built directly: ``dataclasses.replace``
        costs several times more, and every intercepted request resolves one)."""
        return Binding(
            self.task,
            self.attempt_id,
            self.generation,
            self.worker,
            self.lease_expires_at,
            self.ttl_s,
            source,
        )


# The operations (``Command.operation``) whose outcome changes who holds a lease.
_LEASE_OPERATIONS = frozenset({"claim", "heartbeat", "release"})


class Bindings(WriteObserver):
    def __init__(self, store: Store, clock: Clock, *, margin_s: float = 2.0) -> None:
        self._store = store
        self._clock = clock
        self._margin_s = margin_s
        self._current: dict[str, Binding] = {}
        self._fenced: dict[str, StaleGeneration] = {}
        self._when_fenced: list[Callable[[StaleGeneration], None]] = []

    def when_fenced(self, listener: Callable[[StaleGeneration], None]) -> None:
        """Call ``listener`` each time an attempt is fenced off here (superseded by a
        claim, or released): the PostgreSQL relay closes that attempt's connections, so
        an open transaction of a stalled worker cannot hold its locks against the next."""
        self._when_fenced.append(listener)

    # ---- store observer: keep up with leases written through this sidecar ---------

    def done(self, command: Command[Any], result: Any, seconds: float) -> None:
        # Called on every write; most (effects, checkpoints) change no lease: out at once,
        # by a string compare rather than isinstance checks against the abstract commands.
        if command.operation not in _LEASE_OPERATIONS:
            return
        if isinstance(result, Claim):
            previous = self._current.get(result.task)
            if previous is not None and previous.attempt_id != result.attempt_id:
                self._fence(previous, result.generation, f"superseded by {result.attempt_id}")
            self._current[result.task] = Binding(
                result.task,
                result.attempt_id,
                result.generation,
                result.worker,
                result.lease_expires_at,
                (result.lease_expires_at - self._clock.now()).total_seconds(),
                "claim",
            )
        elif isinstance(command, Heartbeat) and isinstance(result, TaskState):
            self._learn(result)
        elif isinstance(command, Release):
            known = self._current.pop(command.task, None)
            if known is not None and known.attempt_id == command.attempt_id:
                self._fence(known, known.generation, "the lease was released")

    def refused(self, command: Command[Any], error: SidecarError, seconds: float) -> None:
        if isinstance(error, StaleGeneration):
            self._fenced[error.attempt_id] = error
            known = self._current.get(error.task)
            if known is not None and known.attempt_id == error.attempt_id:
                del self._current[error.task]

    def _fence(self, binding: Binding, current: int, reason: str) -> None:
        stale = StaleGeneration(
            binding.task, binding.attempt_id, binding.generation, current, reason
        )
        self._fenced[binding.attempt_id] = stale
        for listener in self._when_fenced:
            listener(stale)

    def _learn(self, state: TaskState) -> Binding | None:
        lease = state.lease
        if lease is None or lease.released_at is not None:
            self._current.pop(state.task, None)
            return None
        binding = Binding(
            state.task,
            lease.attempt_id,
            lease.generation,
            lease.worker,
            lease.expires_at,
            lease.ttl_s,
            "store",
        )
        self._current[state.task] = binding
        return binding

    # ---- resolving a request's binding -----------------------------------------

    async def for_attempt(self, task: str, attempt_id: str) -> Binding:
        """The binding of a pinned attempt; StaleGeneration if it is no longer current."""
        if (fenced := self._fenced.get(attempt_id)) is not None:
            raise fenced
        known = self._current.get(task)
        if known is None or known.attempt_id != attempt_id:
            known = await self._reload(task)
        if known is None or known.attempt_id != attempt_id:
            attempt = await self._store.attempt(attempt_id)
            if attempt is None or attempt.task != task:
                raise NotFound(f"task {task} has no attempt {attempt_id}")
            current = known.generation if known else attempt.generation
            raise StaleGeneration(
                task,
                attempt_id,
                attempt.generation,
                current,
                "this attempt no longer holds the lease",
            )
        return known.via("credentials")

    async def for_task(self, task: str, source: str) -> Binding:
        """The task's current attempt; TaskUnbound if nobody holds its lease."""
        known = self._current.get(task) or await self._reload(task)
        if known is None:
            raise TaskUnbound(f"task {task} has no live lease: claim it first (sidecar exec)")
        return known.via(source)

    async def _reload(self, task: str) -> Binding | None:
        view = await self._store.task_view(task)
        return None if view is None else self._learn(view.state)

    async def with_time_left(self, binding: Binding) -> timedelta:
        """Time the binding's lease has left beyond the safety margin; LeaseExpiring if none.

        A sidecar must not count on a renewal it has not seen: when the lease it knows is
        within the margin, it re-reads the store once (a heartbeat may have gone through
        another sidecar) and refuses if the lease is still about to expire.
        """
        margin = timedelta(seconds=min(self._margin_s, binding.ttl_s / 4))
        left = binding.lease_expires_at - self._clock.now() - margin
        if left > timedelta(0):
            return left
        view = await self._store.task_view(binding.task)
        fresh = None if view is None else self._learn(view.state)
        if fresh is not None and fresh.attempt_id == binding.attempt_id:
            left = fresh.lease_expires_at - self._clock.now() - margin
            if left > timedelta(0):
                return left
        elif (
            view is not None
            and binding.source == "credentials"
            and view.state.generation > binding.generation
        ):
            # The pinned attempt was taken over through another sidecar on the same store
            # (this one saw no claim): it is fenced for good, not waiting for a renewal.
            current = view.state.generation
            self._fence(binding, current, f"superseded by generation {current}")
            raise self._fenced[binding.attempt_id]
        raise LeaseExpiring(
            f"task {binding.task}: the lease of attempt {binding.attempt_id} expires at "
            f"{binding.lease_expires_at.isoformat()} and was not renewed; matched writes are "
            "held back until it is (self-fencing)",
            retry_after_s=1.0,
        )
