"""The review's active part: prove fencing on a scratch task, and time its own writes.

On a task of its own (:data:`~sidecar.review.SCRATCH_PREFIX` + random hex) the review
claims (generation 1), releases, claims again (generation 2), then writes a checkpoint
with generation 1: the store must refuse it (``stale_generation``).  A store that took
it has fencing switched off or broken, and the review fails loudly.  While it holds
generation 2 it times checkpoint writes, and (against a store) effect writes - so the
latency it reports is of writes it made and timed itself, not of the agents' traffic.
The scratch task is deleted afterwards, so it shows in no listing.

Two targets: a store opened by the CLI, and a running sidecar's control API (its claim,
release and checkpoint routes; ``DELETE /v1/review/scratch/{task}`` for the clean-up).
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import timedelta
from typing import Protocol
from urllib.parse import quote

from sidecar.cli.control_client import ControlClient
from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import SidecarError, StaleGeneration
from sidecar.review import SCRATCH_PREFIX
from sidecar.review.figures import FenceProof, Latency
from sidecar.review.tally import percentiles
from sidecar.runtime.clock import SystemClock
from sidecar.store import Store

WORKER = "sidecar-review"
TTL_S = 60.0
#: timed writes of each kind: enough for a p95, few enough to take well under a second.
SAMPLES = 20
_PROBLEM = re.compile(r"\((\d{3}) (\w+)\)$")


class Target(Protocol):
    """Where the proof writes."""

    #: what a timed write includes, for the report.
    timed: str

    async def claim(self, task: str) -> tuple[str, int]: ...
    async def release(self, task: str, attempt_id: str, generation: int) -> None: ...
    async def checkpoint(self, task: str, attempt_id: str, generation: int, stage: str) -> None:
        """Write a checkpoint; raise StaleGeneration if fencing refused it."""
        ...

    async def effect_writes(self, task: str, attempt_id: str, generation: int) -> list[float]:
        """Time recording effects (pending, then completed): seconds per write, or none
        when this target has no way to write an effect."""
        ...

    async def remove(self, task: str) -> bool: ...


class StoreTarget:
    timed = "the review's own writes to the store, submit to durable commit"

    def __init__(self, store: Store) -> None:
        self.store = store

    async def claim(self, task: str) -> tuple[str, int]:
        granted = await self.store.claim(task, WORKER, TTL_S)
        return granted.attempt_id, granted.generation

    async def release(self, task: str, attempt_id: str, generation: int) -> None:
        await self.store.release(task, attempt_id, generation)

    async def checkpoint(self, task: str, attempt_id: str, generation: int, stage: str) -> None:
        await self.store.append_checkpoint(task, attempt_id, generation, stage, {})

    async def effect_writes(self, task: str, attempt_id: str, generation: int) -> list[float]:
        seconds: list[float] = []
        for n in range(SAMPLES):
            key = f"review-probe-{n}"
            started = time.perf_counter()
            await self.store.record_pending(
                task,
                key,
                attempt_id,
                generation,
                kind="http",
                rule="sidecar-review",
                fingerprint=key,
                idempotency_key=None,
                request={},
            )
            seconds.append(time.perf_counter() - started)
            started = time.perf_counter()
            await self.store.transition_effect(
                task,
                key,
                attempt_id,
                generation,
                EffectState.COMPLETED,
                response=RecordedResponse(200),
            )
            seconds.append(time.perf_counter() - started)
        return seconds

    async def remove(self, task: str) -> bool:
        # A cutoff ahead of now: the scratch task was just updated, and is to go at once.
        cutoff = SystemClock().now() + timedelta(hours=1)
        return (await self.store.prune_task(task, cutoff)).deleted


class ControlTarget:
    timed = (
        "the review's own checkpoint writes through the control API, request to answer "
        "(HTTP round trip included)"
    )

    def __init__(self, control: ControlClient) -> None:
        self.control = control

    def _path(self, task: str, what: str) -> str:
        return f"/v1/tasks/{quote(task, safe='')}/{what}"

    async def claim(self, task: str) -> tuple[str, int]:
        body = {"worker": WORKER, "ttl_s": TTL_S}
        granted = await self.control.call("POST", self._path(task, "claim"), body=body)
        return str(granted["attempt_id"]), int(granted["generation"])

    async def release(self, task: str, attempt_id: str, generation: int) -> None:
        body = {"attempt_id": attempt_id, "generation": generation}
        await self.control.call("POST", self._path(task, "release"), body=body)

    async def checkpoint(self, task: str, attempt_id: str, generation: int, stage: str) -> None:
        body = {"attempt_id": attempt_id, "generation": generation, "stage": stage, "outputs": {}}
        try:
            await self.control.call("POST", self._path(task, "checkpoints"), body=body)
        except SidecarError as error:
            # The client keeps a problem's status and code only in its detail's tail.
            found = _PROBLEM.search(error.detail)
            if found and found.groups() == ("409", StaleGeneration.code):
                raise StaleGeneration(task, attempt_id, generation, -1, error.detail) from error
            raise

    async def effect_writes(self, task: str, attempt_id: str, generation: int) -> list[float]:
        return []  # effects are written by the proxy; the control API has no route for it

    async def remove(self, task: str) -> bool:
        found = await self.control.call("DELETE", f"/v1/review/scratch/{quote(task, safe='')}")
        return bool(found.get("deleted"))


def scratch_task() -> str:
    return SCRATCH_PREFIX + secrets.token_hex(6)


async def prove_fencing(target: Target) -> tuple[FenceProof, Latency | None, Latency | None]:
    """Run the proof on a new scratch task; with it, the checkpoint and effect write
    latencies timed while the task was held (None when not measured)."""
    task = scratch_task()
    steps: list[str] = []
    refused_with: str | None = None
    checkpoint_write = effect_write = None
    first, gen1 = await target.claim(task)
    steps.append(f"claimed {task}: attempt {first}, generation {gen1}")
    try:
        await target.release(task, first, gen1)
        steps.append(f"released generation {gen1}")
        second, gen2 = await target.claim(task)
        steps.append(f"claimed again: attempt {second}, generation {gen2}")
        try:
            await target.checkpoint(task, first, gen1, "STALE_WRITE")
            steps.append(f"a checkpoint with generation {gen1} was ACCEPTED: fencing is off")
        except StaleGeneration:
            refused_with = StaleGeneration.code
            steps.append(f"a checkpoint with generation {gen1} was refused: {refused_with}")
        except SidecarError as error:
            refused_with = error.code
            steps.append(f"a checkpoint with generation {gen1} failed otherwise: {error.detail}")
        checkpoint_write = await _timed_checkpoints(target, task, second, gen2)
        seconds = await target.effect_writes(task, second, gen2)
        if seconds:
            effect_write = Latency(
                what="effect write (record pending, record outcome)",
                how=target.timed + f"; {SAMPLES} effects on the scratch task, 2 writes each",
                samples=percentiles(seconds),
            )
        await target.release(task, second, gen2)
        steps.append(f"released generation {gen2}")
    finally:
        cleaned = await target.remove(task)
        steps.append("scratch task deleted" if cleaned else "scratch task NOT deleted")
    proof = FenceProof(
        task=task,
        ok=refused_with == StaleGeneration.code and gen2 == gen1 + 1,
        refused_with=refused_with,
        cleaned_up=cleaned,
        steps=steps,
    )
    return proof, checkpoint_write, effect_write


async def _timed_checkpoints(target: Target, task: str, attempt_id: str, gen: int) -> Latency:
    seconds = []
    for n in range(SAMPLES):
        started = time.perf_counter()
        await target.checkpoint(task, attempt_id, gen, f"REVIEW_PROBE_{n}")
        seconds.append(time.perf_counter() - started)
    return Latency(
        what="checkpoint write",
        how=target.timed + f"; {SAMPLES} checkpoints on the scratch task",
        samples=percentiles(seconds),
    )
