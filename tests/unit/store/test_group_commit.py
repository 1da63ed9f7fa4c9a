"""Group commit: writers queue, a lane commits everything that queued meanwhile as one
batch, and each writer is answered with its own outcome once that batch is committed.

The lanes are driven with a commit function of the test's own that keeps the batches it
was handed (and can be held open), so what is asserted is what a store would see."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sidecar.errors import NotFound, StoreUnavailable, UnstorableValue
from sidecar.store.group_commit import GroupCommit


class Disk:
    """Stands in for a store's transaction: commits batches of words, answering each work
    with its upper-case; a word in ``refused`` is answered with NotFound, a word in
    ``poison`` fails the whole batch as a value the store cannot hold."""

    def __init__(self, *, poison: frozenset[str] = frozenset()) -> None:
        self.batches: list[list[str]] = []
        self.committed: list[str] = []
        self.poison = poison
        self.refused: set[str] = set()
        self.gate: asyncio.Event | None = None  # set: batches wait for it before committing
        self.entered = asyncio.Event()  # a batch is being committed
        self.failure: BaseException | None = None  # the next batch fails with it
        self.in_flight = 0
        self.most_in_flight = 0

    def hold(self) -> None:
        self.gate = asyncio.Event()

    def let_go(self) -> None:
        assert self.gate is not None
        self.gate.set()

    async def commit(self, works: list[Any]) -> list[Any]:
        self.batches.append(list(works))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.entered.set()
        try:
            if self.gate is not None:
                await self.gate.wait()
            await asyncio.sleep(0)
            if self.failure is not None:
                failure, self.failure = self.failure, None
                raise failure
            if poisoned := [w for w in works if w in self.poison]:
                raise UnstorableValue(f"cannot hold {poisoned[0]}")
            self.committed += works
            return [NotFound(w) if w in self.refused else w.upper() for w in works]
        finally:
            self.in_flight -= 1


@pytest.fixture
async def disk() -> Disk:
    return Disk()


async def started(disk: Disk, **options: Any) -> GroupCommit:
    lanes = GroupCommit(disk.commit, name="test-store", **options)
    lanes.start()
    return lanes


async def test_a_batch_commits_once_for_every_write_queued_meanwhile(disk):
    lanes = await started(disk)
    disk.hold()
    first = asyncio.ensure_future(lanes.submit("a"))
    await disk.entered.wait()  # "a" is being committed; these queue behind it
    rest = [asyncio.ensure_future(lanes.submit(w)) for w in ("b", "c", "d")]
    await asyncio.sleep(0.01)
    assert disk.batches == [["a"]], "nothing else is committed while a batch is open"
    assert not any(f.done() for f in (first, *rest)), "no one is answered before its commit"
    disk.let_go()
    assert await asyncio.gather(first, *rest) == ["A", "B", "C", "D"]
    assert disk.batches == [["a"], ["b", "c", "d"]]
    await lanes.stop()


async def test_each_writer_gets_its_own_outcome_and_a_refusal_fails_only_its_writer(disk):
    lanes = await started(disk)
    disk.refused.add("missing")
    outcomes = await asyncio.gather(
        lanes.submit("x"), lanes.submit("missing"), lanes.submit("y"), return_exceptions=True
    )
    assert outcomes[0] == "X"
    assert isinstance(outcomes[1], NotFound)
    assert outcomes[2] == "Y"
    assert disk.committed == ["x", "missing", "y"], "a refused work is still one of the batch"
    await lanes.stop()


async def test_a_batch_holds_at_most_max_batch_writes(disk):
    lanes = await started(disk, max_batch=2)
    disk.hold()
    first = asyncio.ensure_future(lanes.submit("a"))
    await disk.entered.wait()
    rest = [asyncio.ensure_future(lanes.submit(w)) for w in "bcdef"]
    await asyncio.sleep(0)
    disk.let_go()
    await asyncio.gather(first, *rest)
    assert disk.batches == [["a"], ["b", "c"], ["d", "e"], ["f"]]
    await lanes.stop()


async def test_a_value_the_store_cannot_hold_fails_only_the_write_that_carries_it():
    disk = Disk(poison=frozenset({"bad"}))
    lanes = await started(disk)
    disk.hold()
    first = asyncio.ensure_future(lanes.submit("a"))
    await disk.entered.wait()
    rest = [asyncio.ensure_future(lanes.submit(w)) for w in ("b", "bad", "c")]
    await asyncio.sleep(0)
    disk.let_go()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert outcomes[:2] == ["A", "B"]
    assert isinstance(outcomes[2], UnstorableValue)
    assert outcomes[3] == "C"
    assert disk.committed == ["a", "b", "c"]
    assert disk.batches[1:] == [["b", "bad", "c"], ["b"], ["bad"], ["c"]], (
        "the failed batch is committed again one write at a time"
    )
    await lanes.stop()


async def test_a_failed_batch_answers_every_writer_unavailable_and_the_lane_goes_on(disk):
    lanes = await started(disk)
    disk.hold()
    first = asyncio.ensure_future(lanes.submit("a"))
    await disk.entered.wait()
    disk.failure = OSError("disk full")
    disk.let_go()
    with pytest.raises(StoreUnavailable, match="test-store: write failed: disk full"):
        await first
    assert disk.committed == []
    assert await lanes.submit("b") == "B", "the next batch is committed"
    await lanes.stop()


async def test_a_store_error_of_a_failed_batch_reaches_each_writer_as_it_is(disk):
    lanes = await started(disk)
    outage = StoreUnavailable("the disk went away")
    disk.failure = outage
    outcomes = await asyncio.gather(lanes.submit("a"), lanes.submit("b"), return_exceptions=True)
    assert disk.batches == [["a", "b"]]
    assert outcomes == [outage, outage]
    assert disk.committed == []
    await lanes.stop()


async def test_a_writer_that_goes_away_still_has_its_write_committed(disk):
    lanes = await started(disk)
    disk.hold()
    first = asyncio.ensure_future(lanes.submit("a"))
    await disk.entered.wait()
    impatient = asyncio.ensure_future(lanes.submit("b"))
    patient = asyncio.ensure_future(lanes.submit("c"))
    await asyncio.sleep(0)
    impatient.cancel()
    disk.let_go()
    assert await asyncio.gather(first, patient) == ["A", "C"]
    assert disk.committed == ["a", "b", "c"]
    await lanes.stop()


async def test_stopping_commits_what_is_queued_then_refuses_new_writes(disk):
    lanes = await started(disk)
    disk.hold()
    queued = [asyncio.ensure_future(lanes.submit(w)) for w in ("a", "b", "c")]
    await disk.entered.wait()
    stopping = asyncio.ensure_future(lanes.stop())
    await asyncio.sleep(0)
    assert not lanes.running
    disk.let_go()
    await stopping
    assert await asyncio.gather(*queued) == ["A", "B", "C"]
    with pytest.raises(StoreUnavailable, match="the store test-store is not open"):
        await lanes.submit("d")
    assert disk.committed == ["a", "b", "c"]


async def test_a_store_never_started_refuses_writes(disk):
    lanes = GroupCommit(disk.commit, name="test-store")
    assert not lanes.running
    with pytest.raises(StoreUnavailable, match="not open"):
        await lanes.submit("a")
    assert disk.batches == []


async def test_several_lanes_commit_batches_side_by_side(disk):
    lanes = await started(disk, lanes=3, max_batch=1)
    disk.hold()
    writes = [asyncio.ensure_future(lanes.submit(w)) for w in "abcdef"]
    for _ in range(5):
        await asyncio.sleep(0)
    assert disk.most_in_flight == 3, "one batch per lane is open at once"
    disk.let_go()
    assert await asyncio.gather(*writes) == list("ABCDEF")
    assert sorted(disk.committed) == list("abcdef")
    await lanes.stop()


async def test_a_single_lane_never_opens_two_batches_at_once(disk):
    lanes = await started(disk, max_batch=1)
    await asyncio.gather(*(lanes.submit(w) for w in "abcdefgh"))
    assert disk.most_in_flight == 1
    assert disk.committed == list("abcdefgh"), "one lane commits in the order queued"
    await lanes.stop()
