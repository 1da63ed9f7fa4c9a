"""The randomized kill test: an outside agent, its sidecar, or both, SIGKILLed at random
instants, then resumed as new attempts until the task is finished; the outside world is
counted afterwards.

    stack = Stack.start(root, rules=[...], hosts=HOSTS)
    verdict = run_iteration(stack, random.Random(7), number=1)
    verdict.duplicates, verdict.lost          # both must be empty

Each iteration is a new task whose agent (:mod:`tests.support.torture_agent`) makes six
effects through the sidecar; one real SIGKILL lands at a uniformly random instant of its
run, on the agent, on the sidecar (restarted on the same data and ports), or on both.
Then the agent is run again from the top as a new attempt (`sidecar exec`) until it
finishes.  The verdict reads the counting upstream: every effect of the task exactly
once - charges by order, things by name - and, if the agent ever had to stop on 409
``effect_unknown`` (CANNOT DETERMINE), whether the sidecar had died (the one case the
sidecar cannot know the outcome of; an agent's death alone must never cause it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sidecar.testing.processes import Child
from tests.support.stack import Stack

VICTIMS = ("agent", "sidecar", "both")
EFFECTS = 6
KILL_WINDOW_S = 4.0  # a clean run takes 1-3 s: kills land before, during and after it
RUNS_MAX = 6


@dataclass
class Verdict:
    number: int
    victim: str
    kill_at_s: float
    killed: bool
    runs: int
    finished: bool
    blocked: bool
    duplicates: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No duplicate, nothing lost, and blocked only if the sidecar died."""
        blocked_fairly = not self.blocked or self.victim in ("sidecar", "both")
        return (
            not self.duplicates
            and not self.lost
            and blocked_fairly
            and (self.finished or self.blocked)
        )


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def _agent(stack: Stack, task: str, tag: str, seed: int) -> Child:
    return stack.exec_agent(
        task, "-m", "tests.support.torture_agent", tag, str(seed), ttl_s=3, wait_s=60
    )


def _kill(stack: Stack, agent: Child, victim: str) -> bool:
    """SIGKILL the victim; whether a process was in fact killed (the agent may have
    finished already, or not have started its interpreter yet)."""
    if agent.proc.poll() is not None:
        return False
    killed = False
    if victim in ("agent", "both"):
        found = next((line for line in agent.lines if line.startswith("pid ")), None)
        if found is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(found.split()[1]), signal.SIGKILL)
                killed = True
    if victim in ("sidecar", "both"):
        stack.kill_sidecar()
        stack.start_sidecar()
        killed = True
    return killed


def run_iteration(
    stack: Stack,
    rng: random.Random,
    number: int,
    *,
    victim: str | None = None,
    kill_window_s: float = KILL_WINDOW_S,
) -> Verdict:
    """One task: run, one SIGKILL (``victim``, or drawn), resume until done; count."""
    started = time.monotonic()
    task = f"torture-{number}-{rng.randrange(1 << 30):x}"
    tag, seed = task, rng.randrange(1 << 30)
    victim = victim or rng.choice(VICTIMS)
    kill_at = round(rng.uniform(0.0, kill_window_s), 2)
    agent = _agent(stack, task, tag, seed)
    time.sleep(kill_at)
    killed = _kill(stack, agent, victim)
    agent.proc.wait(timeout=180)
    runs, status = 1, agent.proc.returncode
    while status not in {0, 3} and runs < RUNS_MAX:
        runs += 1
        agent = _agent(stack, task, tag, seed)
        status = agent.proc.wait(timeout=240)
    verdict = Verdict(number, victim, kill_at, killed, runs, status == 0, status == 3)
    charges = Counter(c["order"] for c in _get(f"{stack.upstream_url}/_upstream/charges"))
    things = Counter(t["name"] for t in _get(f"{stack.upstream_url}/_upstream/things"))
    made = {f"{tag}-{n}": (charges if n in (1, 4) else things) for n in range(1, EFFECTS + 1)}
    for name, seen in made.items():
        if seen[name] > 1:
            verdict.duplicates[name] = seen[name]
        elif seen[name] == 0 and verdict.finished:
            verdict.lost.append(name)
    verdict.seconds = round(time.monotonic() - started, 1)
    return verdict


def report(verdicts: list[Verdict]) -> str:
    """The table the bench prints: one line per iteration, then the totals."""
    lines = ["| # | victim | kill at (s) | killed | runs | finished | blocked | dup | lost | s |",
             "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in verdicts:
        lines.append(
            f"| {v.number} | {v.victim} | {v.kill_at_s} | {v.killed} | {v.runs} | "
            f"{v.finished} | {v.blocked} | {sum(v.duplicates.values())} | {len(v.lost)} | "
            f"{v.seconds} |"
        )
    dup = sum(sum(v.duplicates.values()) for v in verdicts)
    lost = sum(len(v.lost) for v in verdicts)
    unfair = sum(1 for v in verdicts if v.blocked and v.victim == "agent")
    lines.append("")
    lines.append(
        f"iterations {len(verdicts)}, effects {len(verdicts) * EFFECTS}, duplicates {dup}, "
        f"lost {lost}, blocked {sum(v.blocked for v in verdicts)} "
        f"(after an agent-only kill: {unfair}), unfinished "
        f"{sum(not v.finished and not v.blocked for v in verdicts)}"
    )
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover - see bench/torture.py
    sys.exit("run it with ./run bench torture")
