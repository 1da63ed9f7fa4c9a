"""Binding, fencing, refusal keeping and durable writes, shared by HTTP and SQL.

Each protocol calls the same four steps; only the words differ (``protocol`` is the
label of ``sidecar_stale_writes_refused`` for a refusal made before the store saw the
write: ``proxy`` or ``postgres``; refusals the store itself makes are counted by its
observer, so none is counted twice).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from datetime import timedelta

from sidecar.domain.text import scrubbed_text
from sidecar.errors import SidecarError, StaleGeneration, StoreUnavailable
from sidecar.recording.bindings import Binding, Bindings, BindRequest
from sidecar.runtime.aio import spawn
from sidecar.runtime.metrics import Metrics
from sidecar.store import Store

log = logging.getLogger("sidecar.effects")


class Recorder:
    def __init__(
        self, store: Store, bindings: Bindings, metrics: Metrics, *, store_retry_s: float = 2.0
    ) -> None:
        self.store = store
        self.bindings = bindings
        self.metrics = metrics
        self.store_retry_s = store_retry_s

    async def bind(self, request: BindRequest | None, what: str, protocol: str) -> Binding | None:
        """The binding ``request`` names (None if it names no task); a fenced attempt
        raises StaleGeneration, kept in the audit trail."""
        if request is None or request.task is None:
            return None
        try:
            if request.attempt_id is not None:
                return await self.bindings.for_attempt(request.task, request.attempt_id)
            return await self.bindings.for_task(request.task, request.source)
        except StaleGeneration as fenced:
            self.keep_refusal(fenced, what, protocol)
            raise

    async def admit(self, binding: Binding, what: str, protocol: str) -> timedelta:
        """Self-fencing (SPEC §3.5a): the time the lease has left beyond its margin;
        LeaseExpiring if none, StaleGeneration (kept) if another attempt took over."""
        try:
            return await self.bindings.with_time_left(binding)
        except StaleGeneration as fenced:
            self.keep_refusal(fenced, what, protocol)
            raise

    def keep_refusal(self, fenced: StaleGeneration, what: str, protocol: str) -> None:
        """Count a write fenced before it reached the store and keep it there, in the
        background, so the audit trail shows every refused write, not only the store's."""
        self.metrics.stale_writes_refused.labels(protocol).inc()
        reason = scrubbed_text(f"{what}: {fenced.reason}")  # the text may carry any bytes

        async def write() -> None:
            try:
                await self.durably(lambda: self.store.note_refusal(fenced, reason))
            except SidecarError as error:
                log.warning("refusal of %s not kept: %s", fenced.attempt_id, error.detail)

        spawn(write(), name=f"refusal:{fenced.task}")

    async def durably[T](self, write: Callable[[], Awaitable[T]]) -> T:
        """Run a store write, retrying an unavailable store with backoff and jitter for
        ``store_retry_s``: the last try is made at the deadline, not a backoff step before
        it, so a refusal always comes after the whole bound."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.store_retry_s
        delay = 0.05
        while True:
            try:
                return await write()
            except StoreUnavailable:
                left = deadline - loop.time()
                if left <= 0:
                    raise
                await asyncio.sleep(min(left, delay * random.uniform(0.5, 1.5)))  # noqa: S311
                delay = min(delay * 2, 0.5)
