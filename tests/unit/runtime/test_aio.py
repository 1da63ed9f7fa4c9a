"""Background tasks (``sidecar.runtime.aio.spawn``): named, kept alive while nobody else holds
them, and never allowed to die silently."""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref

from sidecar.runtime.aio import spawn


async def test_a_spawned_task_outlives_every_other_reference_to_it():
    async def waits_for_ever() -> None:
        await asyncio.get_running_loop().create_future()  # held by nothing but the task

    held = weakref.ref(spawn(waits_for_ever(), name="unheld"))
    await asyncio.sleep(0)
    gc.collect()  # asyncio itself keeps only a weak reference to a task
    task = held()
    assert task is not None, "the task was collected mid-flight"
    assert not task.done()
    task.cancel()
    await asyncio.wait({task})


async def test_a_spawned_task_carries_its_name_and_its_result():
    async def answer() -> int:
        return 42

    task = spawn(answer(), name="lease:312")
    assert task.get_name() == "lease:312"
    assert await task == 42


async def test_a_task_that_dies_of_an_error_is_logged_by_name(caplog):
    async def broken() -> None:
        raise RuntimeError("the disk caught fire")

    task = spawn(broken(), name="heartbeat:312")
    with caplog.at_level(logging.ERROR, logger="sidecar.runtime.aio"):
        await asyncio.wait({task})
        await asyncio.sleep(0)  # done callbacks run on the next turn of the loop
    (record,) = caplog.records
    assert record.getMessage() == "background task heartbeat:312 died"
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == "the disk caught fire"


async def test_a_cancelled_or_finished_task_is_not_logged(caplog):
    async def forever() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        return None

    with caplog.at_level(logging.DEBUG, logger="sidecar.runtime.aio"):
        stopped = spawn(forever(), name="stopped")
        done = spawn(quick(), name="done")
        await asyncio.sleep(0)
        stopped.cancel()
        await asyncio.wait({stopped, done})
        await asyncio.sleep(0)
    assert caplog.records == []
