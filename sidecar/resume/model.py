"""The resume report: what ``sidecar resume`` prints and ``--json`` / the control API send.

One :class:`Report` per check: the eight :class:`Step` s of the checklist in order, each
with a status and the evidence behind it, every effect of the task with what was found
now and what the next attempt will do with it (:class:`EffectCheck`), and the
:class:`Verdict` with its exit code (SPEC §5).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Status(StrEnum):
    """How a step came out."""

    OK = "ok"
    FAILED = "failed"  # the step's condition does not hold (lease held, store unwritable)
    CANNOT_DETERMINE = "cannot_determine"  # an effect's outcome is not known: a human decides
    SKIPPED = "skipped"  # not run, because an earlier step already decided the verdict


class Found(StrEnum):
    """What asking the outside world about a pending/unknown effect said, now."""

    FOUND = "found"
    NOT_FOUND = "not_found"  # absent, and the first try can no longer land
    WAIT = "wait"  # not found yet, but the first try could still land (SPEC §3.5b, §3.8)
    CANNOT_PROBE = "cannot_probe"  # no probe, or it could not be built or failed
    BY_RECORD = "by_record"  # SQL: the record in the agent's database decides, not a probe
    NOT_PROBED = "not_probed"  # settled in the log already, or probing was skipped


class Next(StrEnum):
    """What the next attempt does when its agent makes this effect's request again."""

    REPLAY = "replay"  # answered from the log (or from the probe's evidence), not sent
    SEND = "send"  # sent again (failed, proven absent, a safe retry, a model call)
    DATABASE = "database"  # SQL: replayed if its record committed, run if not
    REFUSE = "refuse"  # abandoned by a human: 409 effect_abandoned
    WAIT = "wait"  # its first try could still land: told to come back (effect_settling)
    HUMAN = "human"  # CANNOT DETERMINE: blocked until `sidecar effects resolve`


class Verdict(StrEnum):
    SAFE = "safe_to_resume"
    CANNOT_DETERMINE = "cannot_determine"
    LEASE_HELD = "lease_held"
    STORE_UNAVAILABLE = "store_unavailable"
    NOT_RESUMABLE = "not_resumable"  # the task is marked done: claims are refused


#: SPEC §5's exit codes, one per verdict.
EXIT_CODES: dict[Verdict, int] = {
    Verdict.SAFE: 0,
    Verdict.NOT_RESUMABLE: 1,
    Verdict.CANNOT_DETERMINE: 3,
    Verdict.LEASE_HELD: 4,
    Verdict.STORE_UNAVAILABLE: 5,
}


class _Frozen(BaseModel):
    # defer_build: built on the first resume check, not at import - the control API
    # imports these models at every `sidecar serve` start (4 schemas, ~2.5 ms).
    model_config = ConfigDict(frozen=True, defer_build=True)


class Step(_Frozen):
    number: int = Field(ge=1, le=8)
    name: str = Field(
        description="lease, store_writable, last_checkpoint, effects_probed, "
        "next_attempt, fencing, resume_point or verdict"
    )
    title: str
    status: Status
    evidence: list[str] = Field(description="What was seen, one line each.")


class EffectCheck(_Frozen):
    key: str
    rule: str
    kind: str = Field(description="http, git or sql")
    state: str = Field(description="The effect's state in the log.")
    attempt_id: str = Field(description="The attempt that last drove it.")
    generation: int
    found: Found
    evidence: str = Field(description="What the probe (or the log) said.")
    next: Next
    why: str = Field(description="Why the next attempt does that.")
    wait_until: datetime | None = Field(
        default=None, description="With found=wait: when a 'not found' becomes proof."
    )


class Report(_Frozen):
    task: str
    checked_at: datetime
    generation: int = Field(description="The task's current generation; the next claim's is +1.")
    steps: list[Step]
    effects: list[EffectCheck]
    verdict: Verdict
    exit_code: int = Field(
        description="0 safe, 3 CANNOT DETERMINE, 4 lease held, 5 store unavailable, 1 not resumable"
    )
    summary: str


class Probed(_Frozen):
    """One probe's outcome (:mod:`sidecar.resume.probing`), before it is judged."""

    found: Found  # FOUND, NOT_FOUND or CANNOT_PROBE
    evidence: str
