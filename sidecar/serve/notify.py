"""Telling someone when a human is needed: events POSTed to ``serve --notify URL``.

Three events, each one JSON object (``event``, ``at``, ``sidecar`` - the worker name -
and the fields below), POSTed as ``application/json``:

* ``effect_blocked`` - an attempt was refused because an effect's outcome is unknown and
  its rule can neither probe nor safely retry (CANNOT DETERMINE): ``task``,
  ``effect_key``, ``rule``, ``attempt_id``, ``generation``, ``detail``; once per attempt;
* ``stale_write_refused`` - fencing refused a write of a superseded attempt: ``task``,
  ``operation``, ``attempt_id``, ``generation``, ``current_generation``;
* ``lease_taken_over`` - a claim took a task over from an attempt that never released
  it (crashed, frozen or evicted): ``task``, ``attempt_id``, ``generation``, ``worker``,
  ``previous_attempt_id``.

Delivery never slows the sidecar: :meth:`Notifier.announce` only queues.  One task sends
in order, retrying a failed POST (no answer, 429 or 5xx) with backoff up to
``attempts`` times; another 4xx is not retried.  The queue holds at most ``queue_size``
events; past that the oldest is dropped.  Every outcome is counted in
``sidecar_notifications_total{event, outcome}`` (delivered, failed, dropped).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp

from sidecar.runtime.aio import spawn
from sidecar.runtime.metrics import Metrics

log = logging.getLogger("sidecar.notify")

QUEUE_SIZE = 1000
ATTEMPTS = 4
TIMEOUT_S = 5.0
FIRST_BACKOFF_S = 0.5


class Notifier:
    """Queues events and POSTs them to ``url`` (or drops them, counted, when url is None)."""

    def __init__(
        self,
        url: str | None,
        metrics: Metrics,
        *,
        source: str,
        queue_size: int = QUEUE_SIZE,
        attempts: int = ATTEMPTS,
        timeout_s: float = TIMEOUT_S,
        first_backoff_s: float = FIRST_BACKOFF_S,
    ) -> None:
        self.url = url
        self._metrics = metrics
        self._source = source
        self._queue: collections.deque[dict[str, Any]] = collections.deque(maxlen=queue_size)
        self._attempts = attempts
        self._timeout_s = timeout_s
        self._first_backoff_s = first_backoff_s
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()  # set while nothing is queued
        self._idle.set()
        self._sender: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    def announce(self, event: str, fields: Mapping[str, Any]) -> None:
        """Queue ``event`` (never blocks; the oldest queued event goes when full)."""
        if self.url is None:
            return
        if len(self._queue) == self._queue.maxlen:
            dropped = self._queue[0]["event"]
            self._metrics.notifications.labels(dropped, "dropped").inc()
            log.warning("notification queue full: the oldest %s event was dropped", dropped)
        at = datetime.now(UTC).isoformat(timespec="milliseconds")
        self._queue.append({"event": event, "at": at, "sidecar": self._source, **fields})
        self._idle.clear()
        self._wake.set()

    async def start(self) -> None:
        if self.url is None:
            return
        timeout = aiohttp.ClientTimeout(total=self._timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self._sender = spawn(self._send_all(), name="notify")

    async def stop(self, drain_s: float = 2.0) -> None:
        """Send what is queued for up to ``drain_s``, then stop."""
        if self._sender is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), drain_s)
        self._sender.cancel()
        await asyncio.gather(self._sender, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    async def _send_all(self) -> None:
        while True:
            if not self._queue:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            event = self._queue[0]
            outcome = await self._deliver(event)
            if self._queue and self._queue[0] is event:
                self._queue.popleft()
            self._metrics.notifications.labels(event["event"], outcome).inc()

    async def _deliver(self, event: dict[str, Any]) -> str:
        assert self._session is not None
        assert self.url is not None
        backoff = self._first_backoff_s
        why = ""
        for attempt in range(1, self._attempts + 1):
            try:
                async with self._session.post(self.url, json=event) as answer:
                    if answer.status < 300:
                        return "delivered"
                    why = f"answered {answer.status}"
                    if answer.status < 500 and answer.status != 429:
                        break  # the receiver refuses this event: sending it again won't help
            except (aiohttp.ClientError, TimeoutError) as error:
                why = f"{type(error).__name__}: {error}"
            if attempt < self._attempts:
                await asyncio.sleep(backoff)
                backoff *= 2
        log.warning("notification %s not delivered: %s", event["event"], why)
        return "failed"
