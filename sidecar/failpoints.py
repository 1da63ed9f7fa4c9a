"""Named points at which a test can make this process die, for real, with SIGKILL - or
freeze, with SIGSTOP, until someone sends it SIGCONT.

    SIDECAR_FAILPOINTS=effect.after_upstream sidecar serve ...
    SIDECAR_FAILPOINTS=effect.before_send=stop sidecar serve ...

The crash tests (and ``sidecar matrix``) kill the sidecar at each step of the effect flow
this way: no cleanup runs, no buffer is flushed, exactly as when a node dies; a frozen
one is a node that stalls (a long GC pause, a VM migration) and comes back.  Points:

* ``effect.after_pending``  - the effect is recorded pending, nothing forwarded yet;
* ``effect.before_send``    - the lease's time left is about to be checked a last time
  before the effect is sent (a freeze here is the stale-sidecar window);
* ``effect.after_upstream`` - the upstream answered, nothing recorded yet;
* ``effect.after_record``   - the answer is recorded, the agent not answered yet;
* ``sql.after_statement``   - a guarded SQL statement ran (its CommandComplete is in),
  its transaction not committed, the agent not answered;
* ``sql.after_commit``      - the transaction holding a guarded statement and its record
  committed, the agent not answered yet.

``POINT:RULE`` arms a point for one rule only (``effect.after_upstream:github.pulls.create``);
``=stop`` after either freezes instead of killing (once: a thawed process goes on).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("sidecar.failpoints")

POINTS = frozenset(
    {
        "effect.after_pending",
        "effect.before_send",
        "effect.after_upstream",
        "effect.after_record",
        "sql.after_statement",
        "sql.after_commit",
    }
)
# armed point (``POINT`` or ``POINT:RULE``) -> what it does: "kill" or "stop"
_ARMED: dict[str, str] = {
    name: action or "kill"
    for name, _, action in (
        entry.partition("=") for entry in os.environ.get("SIDECAR_FAILPOINTS", "").split(",")
    )
    if name
}


def reach(point: str, rule: str | None = None) -> None:
    """Die (or freeze) here if ``point`` (or ``point:rule``) is armed; else do nothing."""
    armed = point if point in _ARMED else f"{point}:{rule}"
    action = _ARMED.get(armed)
    if action is None:
        return
    log.warning("failpoint %s reached: %s this process", point, action)
    for handler in logging.getLogger().handlers:
        handler.flush()
    if action == "stop":
        del _ARMED[armed]  # once: thawed, the process goes on
        os.kill(os.getpid(), signal.SIGSTOP)
        log.warning("failpoint %s: thawed", point)
        return
    os.kill(os.getpid(), signal.SIGKILL)
