"""Stage checkpoints: fenced, append-only, numbered per task."""

from __future__ import annotations

from datetime import datetime

from sidecar.domain.leases import fence
from sidecar.domain.model import JSON, Checkpoint, TaskState


def append(
    state: TaskState | None,
    task: str,
    attempt_id: str,
    generation: int,
    stage: str,
    outputs: JSON,
    now: datetime,
) -> tuple[TaskState, Checkpoint]:
    """Append a checkpoint for the current holder; raise if it is fenced."""
    current, _ = fence(state, task, attempt_id, generation)
    seq = current.checkpoint_seq + 1
    checkpoint = Checkpoint(
        task=task,
        seq=seq,
        stage=stage,
        attempt_id=attempt_id,
        generation=generation,
        outputs=outputs,
        created_at=now,
    )
    return current.advanced(seq, now), checkpoint
