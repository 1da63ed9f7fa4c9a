"""Named points at which a test can make this process die, for real, with SIGKILL.

    SIDECAR_FAILPOINTS=effect.after_upstream sidecar serve ...

The crash tests (and ``sidecar matrix``) kill the sidecar at each step of the effect flow
this way: no cleanup runs, no buffer is flushed, exactly as when a node dies.  Points:

* ``effect.after_pending``  - the effect is recorded pending, nothing forwarded yet;
* ``effect.after_upstream`` - the upstream answered, nothing recorded yet;
* ``effect.after_record``   - the answer is recorded, the agent not answered yet;
* ``sql.after_statement``   - a guarded SQL statement ran (its CommandComplete is in),
  its transaction not committed, the agent not answered;
* ``sql.after_commit``      - the transaction holding a guarded statement and its record
  committed, the agent not answered yet.

``POINT:RULE`` arms a point for one rule only (``effect.after_upstream:github.pulls.create``).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger("sidecar.failpoints")

POINTS = frozenset(
    {
        "effect.after_pending",
        "effect.after_upstream",
        "effect.after_record",
        "sql.after_statement",
        "sql.after_commit",
    }
)
_ARMED = frozenset(p for p in os.environ.get("SIDECAR_FAILPOINTS", "").split(",") if p)


def reach(point: str, rule: str | None = None) -> None:
    """Die here if ``point`` (or ``point:rule``) is armed; otherwise do nothing."""
    if point in _ARMED or (rule is not None and f"{point}:{rule}" in _ARMED):
        log.warning("failpoint %s reached: killing this process", point)
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGKILL)
