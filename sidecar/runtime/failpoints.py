"""Named points at which a test (or ``sidecar matrix``) can make this process die, for
real, with SIGKILL - or freeze, with SIGSTOP, until someone sends it SIGCONT - or make
an upstream's answer late.

    SIDECAR_FAILPOINTS=effect.after_upstream sidecar serve ...
    SIDECAR_FAILPOINTS=effect.before_send=stop sidecar serve ...
    SIDECAR_FAILPOINTS='effect.after_record#3=stop' sidecar serve ...
    SIDECAR_FAILPOINTS='effect.upstream_answer#2=delay:31' sidecar serve ...

The crash tests and ``sidecar matrix`` kill the sidecar at each step of the effect flow
this way: no cleanup runs, no buffer is flushed, exactly as when a node dies; a frozen
one is a node that stalls (a long GC pause, a VM migration) and comes back.  While the
sidecar is frozen at a point, ``sidecar matrix`` does to the agent what the cell says
(SIGKILL, SIGSTOP) or takes the store away, then thaws it: the fault lands at exactly
that step of exactly that effect.  Points:

* ``effect.before_pending`` - a matched request arrived, nothing recorded or sent yet;
* ``effect.after_pending``  - the effect is recorded pending, nothing forwarded yet;
* ``effect.before_send``    - the lease's time left is about to be checked a last time
  before the effect is sent (a freeze here is the stale-sidecar window);
* ``effect.upstream_answer`` - the upstream's answer has arrived (a ``delay`` here makes
  it late: the rule's timeout fires, the outcome is unknown, the answer still recorded);
* ``effect.after_upstream`` - the upstream answered, nothing recorded yet;
* ``effect.after_record``   - the answer is recorded, the agent not answered yet;
* ``sql.before_pending``    - a guarded SQL statement arrived, nothing recorded or run;
* ``sql.before_statement``  - a guarded SQL statement's record is written in its
  transaction, the statement not sent yet;
* ``sql.after_statement``   - a guarded SQL statement ran (its CommandComplete is in),
  its transaction not committed, the agent not answered;
* ``sql.after_commit``      - the transaction holding a guarded statement and its record
  committed, the agent not answered yet.

An entry is ``POINT[:RULE][#N][=ACTION]``: ``:RULE`` arms it for one rule only,
``#N`` for the N-th time this process reaches it (counted per entry, from 1), and the
action is ``kill`` (the default), ``stop`` (freeze; once: a thawed process goes on) or
``delay:SECONDS`` (only at ``effect.upstream_answer``).  An entry fires once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import dataclass

log = logging.getLogger("sidecar.failpoints")

POINTS = frozenset(
    {
        "effect.before_pending",
        "effect.after_pending",
        "effect.before_send",
        "effect.upstream_answer",
        "effect.after_upstream",
        "effect.after_record",
        "sql.before_pending",
        "sql.before_statement",
        "sql.after_statement",
        "sql.after_commit",
    }
)


@dataclass
class Armed:
    """One ``SIDECAR_FAILPOINTS`` entry and how often its point was reached so far."""

    point: str
    rule: str | None
    nth: int
    action: str
    delay_s: float = 0.0
    reached: int = 0
    fired: bool = False

    def fires(self, point: str, rule: str | None) -> bool:
        if self.fired or point != self.point or (self.rule is not None and rule != self.rule):
            return False
        self.reached += 1
        if self.reached < self.nth:
            return False
        self.fired = True
        return True


def parse(entry: str) -> Armed:
    """``POINT[:RULE][#N][=ACTION]``, or ValueError saying what is wrong with it."""
    where, _, action = entry.partition("=")
    where, _, nth = where.partition("#")
    point, _, rule = where.partition(":")
    if point not in POINTS:
        raise ValueError(f"unknown failpoint {point!r} (points: {', '.join(sorted(POINTS))})")
    if nth and (not nth.isdigit() or int(nth) < 1):
        raise ValueError(f"failpoint {entry!r}: #N counts from 1")
    kind, _, seconds = (action or "kill").partition(":")
    if kind not in ("kill", "stop", "delay") or (kind == "delay") != bool(seconds):
        raise ValueError(f"failpoint {entry!r}: the action is kill, stop or delay:SECONDS")
    armed = Armed(point, rule or None, int(nth or 1), kind)
    if kind == "delay":
        armed.delay_s = float(seconds)
    return armed


def _armed_from(variable: str) -> list[Armed]:
    return [parse(entry) for entry in variable.split(",") if entry]


_ARMED: list[Armed] = _armed_from(os.environ.get("SIDECAR_FAILPOINTS", ""))


def arm(variable: str) -> None:
    """Replace what is armed (tests in this process; the process reads the environment)."""
    _ARMED[:] = _armed_from(variable)


def _firing(point: str, rule: str | None) -> Armed | None:
    # Every entry of the point counts the visit, whichever of them fires.
    fired = [armed for armed in _ARMED if armed.fires(point, rule)]
    return fired[0] if fired else None


def reach(point: str, rule: str | None = None) -> None:
    """Die (or freeze) here if an entry for ``point`` (and ``rule``) fires now."""
    armed = _firing(point, rule)
    if armed is None or armed.action == "delay":
        return
    log.warning("failpoint %s reached: %s this process", point, armed.action)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if armed.action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
        log.warning("failpoint %s: thawed", point)
        return
    os.kill(os.getpid(), signal.SIGKILL)


async def late(point: str, rule: str | None = None) -> None:
    """Wait here, without blocking the loop, if a ``delay`` entry for ``point`` fires."""
    armed = _firing(point, rule)
    if armed is None or armed.action != "delay":
        return
    log.warning("failpoint %s reached: the answer is held %gs", point, armed.delay_s)
    await asyncio.sleep(armed.delay_s)
