"""``sidecar matrix`` from start to end: a clean run discovers the agent's effects, then
the cells run, several at a time (each is its own task on its own sidecar, so none
shares anything with another), and the filled matrix is written.
"""

from __future__ import annotations

import os
import secrets
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from sidecar.errors import ConfigError, SidecarError
from sidecar.matrix import report, stack
from sidecar.matrix.cell import Judge, _checked, run_cell
from sidecar.matrix.faults import Fault
from sidecar.matrix.plan import Cell, EffectPoint, cells, effect_points
from sidecar.matrix.stack import Attempts, Setup, cell_sidecar
from sidecar.rules import RuleSet


@dataclass(frozen=True, slots=True)
class Plan:
    setup: Setup
    rules: RuleSet
    faults: tuple[Fault, ...]
    out: Path
    check: str | None = None
    jobs: int = 2
    setup_command: str | None = None


@dataclass(frozen=True, slots=True)
class Result:
    rows: list[report.Row]
    wall_s: float
    markdown: Path
    json: Path

    @property
    def failed(self) -> bool:
        return any(row.outcome.verdict == "FAIL" for row in self.rows)


def run(plan: Plan, progress: TextIO = sys.stderr) -> Result:
    started = time.monotonic()
    run_id = secrets.token_hex(3)
    workflow = shlex.join(plan.setup.agent)
    try:
        clean = discover(plan, run_id, progress)
    except BaseException:
        stack.kill_everything()
        raise
    todo = cells(clean, plan.faults, plan.rules, run_id, running=plan.setup.control is not None)
    say = _progress(progress, len(todo), started)
    say(f"{len(clean)} effect(s) x {len(plan.faults)} fault(s) = {len(todo)} cells, "
        f"{plan.jobs} at a time")  # fmt: skip
    judge = Judge(clean, plan.rules, plan.check)
    rows: dict[int, report.Row] = {}

    def one(cell: Cell) -> report.Row:
        if plan.setup_command:
            _setup(plan.setup_command, cell.task)
        root = plan.out / "cells" / f"{cell.number:03d}-e{cell.effect.index}-{cell.fault.name}"
        return report.Row(cell, run_cell(cell, plan.setup, judge, root))

    pool = ThreadPoolExecutor(max_workers=max(1, plan.jobs))
    try:
        futures = [pool.submit(one, cell) for cell in todo]
        for done, future in enumerate(as_completed(futures), start=1):
            row = future.result()
            rows[row.cell.number] = row
            say(f"{row.outcome.verdict:<16} {row.cell.effect.label} x {row.cell.fault.name} "
                f"({row.outcome.wall_s:.1f}s)", done)  # fmt: skip
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): the cells' processes live in sessions of their
        # own, so nothing else would stop them; killed, the cells' threads end at once.
        stack.kill_everything()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()
    ordered = [rows[n] for n in sorted(rows)]
    wall_s = time.monotonic() - started
    markdown, as_json = report.write(plan.out, workflow, ordered, wall_s)
    return Result(ordered, wall_s, markdown, as_json)


def discover(plan: Plan, run_id: str, progress: TextIO) -> list[EffectPoint]:
    """Run the agent once with no fault; its effects are the rows of the matrix."""
    task = f"m{run_id}-clean"
    if plan.setup_command:
        _setup(plan.setup_command, task)
    sidecar = cell_sidecar(plan.out / "clean-run", plan.setup)
    (plan.out / "clean-run").mkdir(parents=True, exist_ok=True)
    attempts = Attempts(sidecar, task)
    try:
        sidecar.start()
        started = time.monotonic()
        status, why = attempts.finish(attempts=1, timeout_s=300)
        if status != 0:
            raise SidecarError(
                f"the clean run did not finish ({why}): see {plan.out / 'clean-run'}; the "
                "matrix needs an agent that finishes when nothing goes wrong"
            )
        points = effect_points(sidecar.effects(task))
    finally:
        attempts.kill_all()
        sidecar.close()
    if not points:
        raise SidecarError(
            "the clean run made no effect the rules cover: nothing to inject faults into "
            "(check --rules and --route, or `sidecar rules explain`)"
        )
    if plan.check:
        fake = Cell(0, plan.faults[0], points[0], task, "")
        evidence: list[str] = []
        failed = _checked(plan.check, fake, plan.out / "clean-run", evidence)
        if failed:
            raise ConfigError(f"--check fails on the clean run: {failed[0]}")
    print(f"clean run: {len(points)} effect(s) in {time.monotonic() - started:.1f}s", file=progress)
    for point in points:
        print(f"  {point.label}  {point.key}  ({point.kind}, {point.state})", file=progress)
    return points


def _setup(command: str, task: str) -> None:
    env = dict(os.environ) | {"SIDECAR_MATRIX_TASK": task, "SIDECAR_TASK": task}
    # The user's own setup command, run the way their shell would run it.
    done = subprocess.run(command, shell=True, env=env, check=False, timeout=120)  # noqa: S602
    if done.returncode != 0:
        raise ConfigError(f"--setup exited {done.returncode} for task {task}")


def _progress(stream: TextIO, total: int, started: float) -> Callable[..., None]:
    def say(text: str, done: int | None = None) -> None:
        elapsed = time.monotonic() - started
        if done is None:
            print(text, file=stream, flush=True)
            return
        eta = elapsed / done * (total - done)
        print(
            f"cell {done}/{total}  {text}  elapsed {_clock(elapsed)}, ETA {_clock(eta)}",
            file=stream,
            flush=True,
        )

    return say


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def summary(result: Result) -> str:
    """What the command prints at the end: the totals, each cell that did not pass."""
    counts = report.totals(result.rows)
    lines = [
        f"matrix: {len(result.rows)} cells in {result.wall_s:.0f}s: {counts['PASS']} PASS, "
        f"{counts['FAIL']} FAIL, {counts['CANNOT_DETERMINE']} CANNOT DETERMINE"
    ]
    for row in result.rows:
        if row.outcome.verdict != "PASS":
            first = row.outcome.evidence[0] if row.outcome.evidence else ""
            lines.append(
                f"  {row.outcome.verdict}: {row.cell.effect.label} x {row.cell.fault.name}: {first}"
            )
    lines.append(f"wrote {result.markdown} and {result.json}")
    return "\n".join(lines)
