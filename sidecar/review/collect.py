"""Reading a store's window into the figures, a page at a time.

Every read is a paged, windowed store query (``events_since``, ``refusals_since``,
``stages_since``, ``effects_across``): the log is never in memory at once, and each page
is tallied (:mod:`.tally`) before the next is read.  The fencing proof's scratch tasks
(:data:`~sidecar.review.SCRATCH_PREFIX`) are left out: they are the review's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime

from sidecar.domain.model import EffectEvent, FenceRefusal
from sidecar.review import SCRATCH_PREFIX
from sidecar.review.figures import Review, Window
from sidecar.review.tally import (
    REVIEWED_EVENTS,
    EventTally,
    RefusalTally,
    StageTally,
    UncoveredTally,
)
from sidecar.store import Store
from sidecar.store.base import EffectFilter

PAGE = 500
#: the rule (and kind) name of writes no rule covered (sidecar.proxy.addons.uncovered).
UNCOVERED = "uncovered"


def _ours(task: str) -> bool:
    return task.startswith(SCRATCH_PREFIX)


async def collect(store: Store, since: datetime, until: datetime, source: str) -> Review:
    """The figures of ``store`` from ``since`` to ``until`` (the review's own
    measurements left empty)."""
    events = await _events(store, since, until)
    waiting_now, _ = await store.gauges(until)
    return Review(
        source=source,
        window=Window(since=since, until=until),
        duplicates=events.duplicates(),
        humans=events.humans(waiting_now),
        uncovered=(await _uncovered(store, since, until)).figures(),
        refusals=(await _refusals(store, since, until)).figures(),
        leases=(await _stages(store, since, until)).figures(),
    )


async def _logged[T: (EffectEvent, FenceRefusal)](
    read: Callable[[int], Awaitable[list[tuple[int, T]]]], until: datetime
) -> AsyncIterator[T]:
    """The audit events or fence refusals ``read(after_id)`` pages through, up to
    ``until``, but the review's own."""
    after = 0
    while page := await read(after):
        for _, line in page:
            if line.at <= until and not _ours(line.task):
                yield line
        after = page[-1][0]


async def _events(store: Store, since: datetime, until: datetime) -> EventTally:
    tally = EventTally()
    async for event in _logged(
        lambda after: store.events_since(since, REVIEWED_EVENTS, after, PAGE), until
    ):
        tally.add(event)
    return tally


async def _refusals(store: Store, since: datetime, until: datetime) -> RefusalTally:
    tally = RefusalTally()
    async for refusal in _logged(lambda after: store.refusals_since(since, after, PAGE), until):
        tally.add(refusal)
    return tally


async def _stages(store: Store, since: datetime, until: datetime) -> StageTally:
    tally = StageTally()
    cursor: tuple[str, int] | None = None
    while rows := await store.stages_since(since, cursor, PAGE):
        for row in rows:
            if row.claimed_at <= until and not _ours(row.task):
                tally.add(row)
        cursor = (rows[-1].task, rows[-1].seq)
    return tally


async def _uncovered(store: Store, since: datetime, until: datetime) -> UncoveredTally:
    tally = UncoveredTally()
    position: tuple[datetime, str, str] | None = None
    while page := await store.effects_across(EffectFilter(rule=UNCOVERED), position, PAGE):
        for effect in page:
            if effect.created_at < since:
                return tally  # newest first: the rest are older than the window
            if effect.kind == UNCOVERED and effect.created_at <= until and not _ours(effect.task):
                tally.add(effect.key)
        last = page[-1]
        position = (last.created_at, last.task, last.key)
    return tally
