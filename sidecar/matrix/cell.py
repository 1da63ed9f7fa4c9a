"""One cell of the matrix: inject one fault at one effect, resume until the agent
finishes, and judge what the sidecar recorded and what the user's check says.

A cell is PASS when the fault was injected, the agent finished, every effect was
forwarded at most once (the sidecar's own forward records), no effect was made twice
under a new key, every effect ended as in the clean run, no stale write was accepted,
and ``--check`` exits 0.  It FAILs naming what broke, and is CANNOT_DETERMINE when the
fault never landed or an effect waits for a human (the product did its job: it would
not guess; a rule with a probe or an idempotency header would settle it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar.matrix.faults import Action
from sidecar.matrix.plan import Cell, EffectPoint
from sidecar.matrix.stack import Attempts, PrivateSidecar, Setup, cell_sidecar
from sidecar.rules import EffectKind, RuleSet
from sidecar.testing.processes import Child

PASS, FAIL, CANNOT_DETERMINE = "PASS", "FAIL", "CANNOT_DETERMINE"
#: What the sidecar writes in an effect's trail when it sends an effect again because
#: the first try was proven not to have landed: a probe found nothing after the first
#: try settled (HTTP), or the statement's record never committed in the database (SQL).
ABSENCE_PROVEN = ("proved it absent", "no record committed in the target database")
CELL_TIMEOUT_S = 300.0
REACH_TIMEOUT_S = 120.0


@dataclass
class Outcome:
    verdict: str
    evidence: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    tested_at: str = ""


@dataclass(frozen=True, slots=True)
class Judge:
    """What every cell is judged against: the clean run and the user's rules and check."""

    clean: list[EffectPoint]
    rules: RuleSet
    check: str | None = None


def run_cell(cell: Cell, setup: Setup, judge: Judge, root: Path) -> Outcome:
    started = time.monotonic()
    tested_at = datetime.now(UTC).isoformat(timespec="seconds")
    if cell.cannot_run:
        return Outcome(CANNOT_DETERMINE, [f"cannot be run: {cell.cannot_run}"], 0.0, tested_at)
    root.mkdir(parents=True, exist_ok=True)
    sidecar = cell_sidecar(root, setup)
    attempts = Attempts(sidecar, cell.task)
    try:
        sidecar.start(failpoints=cell.failpoints)
        outcome = _run(cell, sidecar, attempts, judge)
    except Exception as error:  # a cell that breaks must not take the matrix down
        outcome = Outcome(CANNOT_DETERMINE, [f"the cell could not be run: {error}"])
    finally:
        attempts.kill_all()
        sidecar.close()
    outcome.wall_s = time.monotonic() - started
    outcome.tested_at = tested_at
    return outcome


def _run(cell: Cell, sidecar: PrivateSidecar, attempts: Attempts, judge: Judge) -> Outcome:
    first = attempts.start()
    action = cell.fault.action
    evidence: list[str] = []
    if cell.watch is not None:
        landed = _when_seen(cell, cell.watch, sidecar, first, evidence)
    elif action is Action.KILL_SIDECAR:
        landed = _sidecar_killed(sidecar, first, evidence)
    elif action is Action.LATE_ANSWER:
        landed = _late_answer(sidecar, first, evidence)
    else:
        landed = _while_frozen(cell, sidecar, first, attempts, evidence)
    if not landed:
        return Outcome(CANNOT_DETERMINE, evidence)
    status, why = (0, "finished") if first.proc.poll() == 0 else (None, "")
    if status != 0 or action is Action.STALE_WORKER:
        status, why = _resumed(attempts)
    evidence.append(f"{len(attempts.runs)} attempt(s); the last: {why}")
    return _judged(cell, sidecar, attempts, judge, status, evidence)


# ---- injecting ---------------------------------------------------------------------


def _wait(condition: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _not_reached(cell: Cell | None, first: Child, evidence: list[str]) -> bool:
    evidence.append(
        "the fault was not reached: the first attempt "
        + (f"exited {first.proc.returncode}" if first.proc.poll() is not None else "hung")
        + " before the sidecar got to "
        + (cell.failpoints if cell else "the point")
    )
    return False


def _when_seen(
    cell: Cell,
    watch: tuple[int, str],
    sidecar: PrivateSidecar,
    first: Child,
    evidence: list[str],
) -> bool:
    """Against a running sidecar: poll the task's effect log until effect #N is in the
    state the fault lands at, then do the fault to the worker (SIGKILL or SIGSTOP)."""
    index, state = watch

    def seen() -> bool:
        effects = [e for e in sidecar.effects(cell.task) if e["kind"] != "uncovered"]
        return len(effects) >= index and _reached(effects[index - 1], state)

    if not _wait(lambda: first.proc.poll() is not None or seen(), REACH_TIMEOUT_S):
        return _not_reached(cell, first, evidence)
    if first.proc.poll() is not None:
        return _not_reached(cell, first, evidence)
    signal_ = signal.SIGSTOP if cell.fault.action is Action.STALE_WORKER else signal.SIGKILL
    os.killpg(first.pid, signal_)
    evidence.append(
        f"worker-1 got {signal_.name} once effect #{index} was seen {state} in the running "
        "sidecar's log (polled)"
    )
    if signal_ is signal.SIGKILL:
        first.kill()
    elif not _wait(lambda: not _lease_live(sidecar, cell.task), 3 * sidecar.setup.lease_ttl_s + 30):
        evidence.append("worker-1's lease did not expire")
    return True


def _reached(effect: dict[str, Any], state: str) -> bool:
    events = [event["event"] for event in effect["events"]]
    return state in events or effect["state"] == state


def _sidecar_killed(sidecar: PrivateSidecar, first: Child, evidence: list[str]) -> bool:
    if not _wait(lambda: not sidecar.alive() or first.proc.poll() is not None, REACH_TIMEOUT_S):
        return _not_reached(None, first, evidence)
    if sidecar.alive():
        return _not_reached(None, first, evidence)
    status = sidecar.child.proc.returncode if sidecar.child else None
    evidence.append(f"sidecar died at the failpoint ({_status(status)}); restarted on its data")
    sidecar.start()
    _end(first, 60.0, evidence, "the first attempt")
    return True


def _late_answer(sidecar: PrivateSidecar, first: Child, evidence: list[str]) -> bool:
    _end(first, REACH_TIMEOUT_S, evidence, "the first attempt")
    if not sidecar.log_mentions("effect.upstream_answer reached"):
        return _not_reached(None, first, evidence)
    evidence.append("the upstream's answer was held past the rule's timeout")
    return True


def _while_frozen(
    cell: Cell, sidecar: PrivateSidecar, first: Child, attempts: Attempts, evidence: list[str]
) -> bool:
    """Wait for the sidecar to freeze at the cell's point, do the fault, thaw it."""
    if not _wait(lambda: sidecar.stopped() or first.proc.poll() is not None, REACH_TIMEOUT_S):
        return _not_reached(cell, first, evidence)
    if not sidecar.stopped():
        return _not_reached(cell, first, evidence)
    action = cell.fault.action
    if action is Action.KILL_AGENT:
        os.killpg(first.pid, signal.SIGKILL)
        sidecar.thaw()
        first.kill()
        evidence.append("agent and worker SIGKILLed with the sidecar frozen at the point")
        return True
    if action is Action.STORE_DOWN:
        return _store_down(sidecar, first, evidence)
    os.killpg(first.pid, signal.SIGSTOP)  # stale-worker: frozen with its lease running out
    sidecar.thaw()
    evidence.append("worker-1 SIGSTOPped at the point")
    if not _wait(lambda: not _lease_live(sidecar, cell.task), 3 * sidecar.setup.lease_ttl_s + 30):
        evidence.append("worker-1's lease did not expire")
    return True


def _store_down(sidecar: PrivateSidecar, first: Child, evidence: list[str]) -> bool:
    lock = sqlite3.connect(sidecar.store_file, timeout=10, isolation_level=None)
    try:
        try:
            lock.execute("BEGIN EXCLUSIVE")
        except sqlite3.OperationalError as error:
            sidecar.thaw()
            evidence.append(f"the store could not be locked: {error}")
            return False
        sidecar.thaw()
        _end(first, 90.0, evidence, "the first attempt (store locked)")
        refused = sidecar.log_mentions("store_unavailable")
        evidence.append(
            "store locked; the sidecar "
            + ("refused with 503 store_unavailable" if refused else "did not say it refused")
        )
        lock.execute("ROLLBACK")
    finally:
        lock.close()
    return True


def _end(run: Child, timeout_s: float, evidence: list[str], who: str) -> None:
    try:
        status = run.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        run.kill_group()
        evidence.append(f"{who} did not end within {timeout_s:g}s: killed")
        return
    evidence.append(f"{who} ended: {_status(status)}")


def _status(status: int | None) -> str:
    if status is None:
        return "running"
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit {status}"


def _lease_live(sidecar: PrivateSidecar, task: str) -> bool:
    found = sidecar.task(task)
    return bool(found and found["lease"] and found["lease"]["live"])


def _resumed(attempts: Attempts) -> tuple[int | None, str]:
    stale = attempts.runs[0] if attempts.runs[0].proc.poll() is None else None
    status, why = attempts.finish(timeout_s=CELL_TIMEOUT_S)
    if stale is not None:  # the stale worker is thawed once another finished the task
        os.killpg(stale.pid, signal.SIGCONT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            stale.wait(timeout=60)
    return status, why


# ---- judging -----------------------------------------------------------------------


def _judged(
    cell: Cell,
    sidecar: PrivateSidecar,
    attempts: Attempts,
    judge: Judge,
    status: int | None,
    evidence: list[str],
) -> Outcome:
    effects = [e for e in sidecar.effects(cell.task) if e["kind"] != "uncovered"]
    failures: list[str] = []
    if status != 0:
        blocked = attempts.blocked()
        if blocked:
            waiting = [f"{_name(e)} waits for a human: {e['detail']}" for e in blocked]
            return Outcome(CANNOT_DETERMINE, waiting + evidence)
        failures.append("the agent did not finish")
    failures += _duplicates(effects, judge)
    forwards = sidecar.forwards(cell.task)
    if forwards is None:
        evidence.append("forwards not counted: the running sidecar's log is not ours to read")
    failures += _resent(forwards or Counter(), effects, judge.rules)
    if status == 0:
        failures += _unfinished(effects, judge)
    if cell.fault.action is Action.STALE_WORKER:
        failures += _stale_writes(sidecar, cell.task, attempts, evidence)
    if judge.check:
        failures += _checked(judge.check, cell, sidecar.root, evidence)
    if failures:
        return Outcome(FAIL, failures + evidence)
    counted = "each forwarded at most once" if forwards is not None else "none made twice"
    evidence.insert(0, f"{len(effects)} effect(s), {counted}")
    return Outcome(PASS, evidence)


def _name(effect: dict[str, Any]) -> str:
    return f"{effect['rule']} {effect['key']!r}"


def _duplicates(effects: list[dict[str, Any]], judge: Judge) -> list[str]:
    """An effect made again under another key: more effects of a rule than the clean run."""
    clean = Counter(point.rule for point in judge.clean)
    now = Counter(str(effect["rule"]) for effect in effects)
    found = []
    for rule, count in now.items():
        if count > clean[rule]:
            keys = ", ".join(repr(e["key"]) for e in effects if e["rule"] == rule)
            found.append(
                f"duplicate: rule {rule} made {count} effects where the clean run made "
                f"{clean[rule]} (keys {keys}): its key changes between attempts"
            )
    return found


def _resent(forwards: Counter[str], effects: list[dict[str, Any]], rules: RuleSet) -> list[str]:
    found = []
    for effect in effects:
        sent = forwards[str(effect["key"])]
        if sent <= 1:
            continue
        rule = rules.get(str(effect["rule"]))
        if rule is not None and (rule.idempotency_header or rule.effect is EffectKind.CACHE):
            continue  # the API dedupes on the key sent first / a model call may be asked again
        details = [str(ev.get("detail") or "") for ev in effect["events"]]
        if any(proof in d for d in details for proof in ABSENCE_PROVEN):
            continue  # sent again only once the first try was proven never to have landed
        found.append(f"duplicate: {_name(effect)} was forwarded {sent} times")
    for effect in effects:
        completed = sum(ev["event"] == "completed" for ev in effect["events"])
        if completed > 1:
            found.append(f"duplicate: {_name(effect)} completed {completed} times")
    return found


def _unfinished(effects: list[dict[str, Any]], judge: Judge) -> list[str]:
    clean = {point.rule: point.state for point in judge.clean}
    return [
        f"{_name(e)} ended {e['state']} (clean run: {clean.get(e['rule'], 'absent')})"
        for e in effects
        if e["state"] != clean.get(e["rule"], "completed")
    ]


def _stale_writes(
    sidecar: PrivateSidecar, task: str, attempts: Attempts, evidence: list[str]
) -> list[str]:
    view = sidecar.task(task) or {"attempts": [], "refused_writes": []}
    stale = next((a for a in view["attempts"] if a["worker"] == "worker-1"), None)
    later = [a for a in view["attempts"] if stale and a["generation"] > stale["generation"]]
    if stale is None or not later:
        return ["no other worker took the task over from the frozen one"]
    takeover = min(str(a["claimed_at"]) for a in later)
    accepted = [
        f"stale write accepted: {_name(e)} {ev['event']} at {ev['at']} by generation "
        f"{ev['generation']} after generation {later[0]['generation']} took over"
        for e in sidecar.effects(task)
        for ev in e["events"]
        if ev["generation"] == stale["generation"]
        and ev["event"] == "pending"
        and str(ev["at"]) > takeover
    ]
    refused = len(view["refused_writes"])
    exit_status = attempts.runs[0].proc.returncode
    evidence.append(
        f"stale worker-1 (generation {stale['generation']}) thawed: {_status(exit_status)}; "
        f"{refused} stale write(s) refused"
    )
    return accepted


def _checked(check: str, cell: Cell, root: Path, evidence: list[str]) -> list[str]:
    env = dict(os.environ) | {
        "SIDECAR_MATRIX_TASK": cell.task,
        "SIDECAR_TASK": cell.task,
        "SIDECAR_MATRIX_FAULT": cell.fault.name,
        "SIDECAR_MATRIX_EFFECT": cell.effect.key,
        "SIDECAR_MATRIX_RULE": cell.effect.rule,
    }
    # The user's own check command, run the way their shell would run it.
    done = subprocess.run(  # noqa: S602
        check, shell=True, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    (root / "check.log").write_text(done.stdout + done.stderr)
    last = (done.stdout + done.stderr).strip().splitlines()[-1:] or [""]
    if done.returncode != 0:
        return [f"--check exited {done.returncode}: {last[0]}"]
    evidence.append("--check passed" + (f": {last[0]}" if last[0] else ""))
    return []
