"""From a clean run's effects to the cells of the matrix: every effect x every fault.

A fault is armed by ordinal: the n-th time the cell's own sidecar reaches a failpoint
is the n-th effect of that kind the agent makes, because a cell's first attempt starts
from scratch exactly as the clean run did.  (Keys cannot be used: an agent may put its
task id in them, and every cell is a task of its own.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.matrix.faults import Action, Fault
from sidecar.rules import EffectKind, RuleSet


@dataclass(frozen=True, slots=True)
class EffectPoint:
    """One effect of the clean run: its place overall and among effects of its family."""

    index: int
    key: str
    rule: str
    kind: str  # http | git | sql
    state: str
    nth: int  # among this family's effects (HTTP requests and pushes / SQL statements)

    @property
    def sql(self) -> bool:
        return self.kind == "sql"

    @property
    def label(self) -> str:
        return f"#{self.index} {self.rule}"


def effect_points(effects: list[dict[str, Any]]) -> list[EffectPoint]:
    """The clean run's effects (control API shapes, in the order they were recorded)."""
    points: list[EffectPoint] = []
    seen = {"http": 0, "sql": 0}
    for effect in effects:
        if effect["kind"] == "uncovered":
            continue  # a write no rule covers is not the sidecar's to guard
        family = "sql" if effect["kind"] == "sql" else "http"
        seen[family] += 1
        points.append(
            EffectPoint(
                len(points) + 1,
                effect["key"],
                effect["rule"],
                effect["kind"],
                effect["state"],
                seen[family],
            )
        )
    return points


@dataclass(frozen=True, slots=True)
class Cell:
    number: int
    fault: Fault
    effect: EffectPoint
    task: str
    #: SIDECAR_FAILPOINTS for the cell's sidecar; empty when the cell cannot be run
    failpoints: str
    cannot_run: str = ""
    #: against a running sidecar (``--control``): the fault lands once effect #N of the
    #: task is seen in this state in its log (polled: less exact than a failpoint)
    watch: tuple[int, str] | None = None


# What a running sidecar's effect log shows at the step a fault lands on.
WATCHED = {
    "agent-killed-after-forward": "pending",
    "agent-killed-after-record": "completed",
    "stale-worker": "completed",
}


def cells(
    points: list[EffectPoint],
    faults: tuple[Fault, ...],
    rules: RuleSet,
    run_id: str,
    *,
    running: bool = False,
) -> list[Cell]:
    """Every effect x every fault; ``running``: against the sidecar ``--control`` names."""
    found: list[Cell] = []
    for point in points:
        for fault in faults:
            number = len(found) + 1
            task = f"m{run_id}-e{point.index}-{fault.name}"
            if running:
                watch, why = _watched(fault, point)
                found.append(Cell(number, fault, point, task, "", why, watch))
                continue
            armed, why = _failpoint(fault, point, points, rules)
            found.append(Cell(number, fault, point, task, armed, why))
    return found


def _watched(fault: Fault, point: EffectPoint) -> tuple[tuple[int, str] | None, str]:
    state = WATCHED.get(fault.name)
    if state is None:
        return None, (
            "needs a private sidecar (its process, failpoints and store are not ours when "
            "--control names a running one); run without --control"
        )
    if fault.before_previous:
        return ((point.index - 1, "completed") if point.index > 1 else (1, "pending")), ""
    return (point.index, state), ""


def _failpoint(
    fault: Fault, point: EffectPoint, points: list[EffectPoint], rules: RuleSet
) -> tuple[str, str]:
    """The failpoint entry of a cell, or ("", why it cannot be run)."""
    rule = rules.get(point.rule)
    if fault.action is Action.LATE_ANSWER and rule is not None and rule.effect is EffectKind.CACHE:
        return "", "a cached model call is asked again when its answer is late: nothing to test"
    if fault.before_previous and point.index > 1:
        previous = points[point.index - 2]
        where = "sql.after_commit" if previous.sql else "effect.after_record"
        return f"{where}#{previous.nth}={_action(fault)}", ""
    if fault.before_previous:
        where = "sql.before_pending" if point.sql else "effect.before_pending"
        return f"{where}#{point.nth}={_action(fault)}", ""
    point_name = fault.sql_point if point.sql else fault.http_point
    if point_name is None:
        kind = "SQL statements" if point.sql else "HTTP requests"
        return "", f"does not apply to {kind}: {fault.failure_point.lower()}"
    action = _action(fault)
    if fault.action is Action.LATE_ANSWER:
        timeout_s = rule.timeout_s if rule is not None else 30.0
        action = f"delay:{timeout_s + 1:g}"
    return f"{point_name}#{point.nth}={action}", ""


def _action(fault: Fault) -> str:
    return "kill" if fault.action is Action.KILL_SIDECAR else "stop"
