"""The faults ``sidecar matrix`` injects, and the rows of the seed's matrix they stand for.

Each fault lands at one named step (a failpoint, :mod:`sidecar.runtime.failpoints`) of one
effect: the HTTP point for requests and git pushes, the SQL point for statements.  What
happens there is one of five actions, each a real signal to a real process (or a real
lock on the store's file):

* ``kill-agent``   - the sidecar freezes itself at the point; the agent and its worker
  (``sidecar exec``'s whole process group) get SIGKILL; the sidecar is thawed;
* ``kill-sidecar`` - the sidecar SIGKILLs itself at the point and is started again on
  the same data and ports;
* ``late-answer``  - the upstream's answer is held past the rule's timeout: the agent
  is told "unknown", the answer is still recorded when it comes;
* ``stale-worker`` - the sidecar freezes at the point; the worker's group gets SIGSTOP
  and stays frozen past its lease while another worker takes the task over and
  finishes it; then it is thawed and whatever it writes must be refused;
* ``store-down``   - the sidecar freezes at the point; the store's file is locked
  exclusively; the sidecar is thawed, must refuse to send what it cannot record, and the
  lock is lifted once the agent gave up.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    KILL_AGENT = "kill-agent"
    KILL_SIDECAR = "kill-sidecar"
    LATE_ANSWER = "late-answer"
    STALE_WORKER = "stale-worker"
    STORE_DOWN = "store-down"


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    action: Action
    #: the failpoint for HTTP effects (requests, git pushes) and for SQL statements;
    #: None where the fault does not apply to that kind of effect
    http_point: str | None
    sql_point: str | None
    #: the seed's columns: its "Failure Point", the row it stands for, what must happen
    failure_point: str
    seed_row: str
    expected: str
    #: for ``stale-worker``: freeze at the previous effect's last step instead, so the
    #: worker is stopped *before* it sends this one
    before_previous: bool = False


FAULTS: tuple[Fault, ...] = (
    Fault(
        "agent-killed-before-request",
        Action.KILL_AGENT,
        "effect.before_pending",
        "sql.before_pending",
        "Agent SIGKILLed as its request reached the sidecar (nothing recorded or sent)",
        "Read repository: process kill mid-read",
        "Restart from the stage's beginning; the effect is made once",
    ),
    Fault(
        "agent-killed-after-forward",
        Action.KILL_AGENT,
        "effect.after_upstream",
        "sql.after_statement",
        "Agent SIGKILLed after the request was forwarded, before its answer was recorded",
        "Generate patch: OOM during inference",
        "The answer is recorded anyway; the next attempt is answered from the log",
    ),
    Fault(
        "agent-killed-after-record",
        Action.KILL_AGENT,
        "effect.after_record",
        "sql.after_commit",
        "Agent SIGKILLed after the answer was recorded, before it read it",
        "Open pull request: kill after API 201, before checkpoint write",
        "Replayed from the log; not sent again",
    ),
    Fault(
        "sidecar-killed-after-pending",
        Action.KILL_SIDECAR,
        "effect.after_pending",
        "sql.before_statement",
        "Sidecar SIGKILLed with the effect recorded pending, nothing forwarded",
        "Apply patch (push): kill before the write",
        "The next attempt proves it absent (or finds it) before sending it once",
    ),
    Fault(
        "sidecar-killed-after-forward",
        Action.KILL_SIDECAR,
        "effect.after_upstream",
        "sql.after_statement",
        "Sidecar SIGKILLed after the upstream answered, before the answer was recorded",
        "Apply patch (push): kill after git push, before checkpoint write",
        "Probe: found, so it is not sent again (or a transaction rolled back: sent once)",
    ),
    Fault(
        "sidecar-killed-after-record",
        Action.KILL_SIDECAR,
        "effect.after_record",
        "sql.after_commit",
        "Sidecar SIGKILLed after the answer was recorded, before the agent got it",
        "Open pull request: kill after API 201, before checkpoint write",
        "Replayed from the log; not sent again",
    ),
    Fault(
        "upstream-timeout",
        Action.LATE_ANSWER,
        "effect.upstream_answer",
        None,
        "The upstream's answer arrives after the rule's timeout (outcome unknown)",
        "Open pull request: API timeout (unknown whether 201 was received)",
        "Treated as unknown; checked (late answer or probe) before it is sent again",
    ),
    Fault(
        "stale-worker",
        Action.STALE_WORKER,
        "effect.after_record",
        "sql.after_commit",
        "Worker frozen past its lease just before this effect; another worker takes over",
        "Any stage: lease expiry while worker is slow",
        "Fencing refuses the stale worker's writes; only the current generation proceeds",
        before_previous=True,
    ),
    Fault(
        "store-unavailable",
        Action.STORE_DOWN,
        "effect.before_pending",
        "sql.before_pending",
        "The store is locked as the effect arrives",
        "Any stage: checkpoint store temporarily unavailable",
        "Not sent without its record (503); made once after the store is back",
    ),
)

BY_NAME = {fault.name: fault for fault in FAULTS}


def chosen(names: str | None) -> tuple[Fault, ...]:
    """The faults ``--faults a,b`` names (all of them without), or ValueError naming the
    unknown ones."""
    if not names:
        return FAULTS
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in BY_NAME]
    if unknown:
        raise ValueError(
            f"unknown fault(s) {', '.join(unknown)}; the faults are: {', '.join(BY_NAME)}"
        )
    return tuple(BY_NAME[n] for n in wanted)
