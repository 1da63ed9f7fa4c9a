"""The filled matrix: ``matrix.md`` in the seed's own table, ``matrix.json`` a row per
effect x fault."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.matrix.cell import FAIL, PASS, Outcome
from sidecar.matrix.plan import Cell


@dataclass(frozen=True, slots=True)
class Row:
    cell: Cell
    outcome: Outcome

    def as_json(self) -> dict[str, Any]:
        point = self.cell.effect
        return {
            "effect": point.key,
            "effect_index": point.index,
            "rule": point.rule,
            "kind": point.kind,
            "fault": self.cell.fault.name,
            "seed_row": self.cell.fault.seed_row,
            "verdict": self.outcome.verdict,
            "evidence": self.outcome.evidence,
            "tested_at": self.outcome.tested_at,
            "task": self.cell.task,
            "seconds": round(self.outcome.wall_s, 1),
        }

    @property
    def tested(self) -> str:
        """The seed's "Tested?" column."""
        outcome = self.outcome
        if outcome.verdict == PASS:
            return f"TESTED {outcome.tested_at[:10]}"
        why = outcome.evidence[0] if outcome.evidence else ""
        word = "FAIL" if outcome.verdict == FAIL else "CANNOT DETERMINE"
        return f"{word}: {why}"


def totals(rows: list[Row]) -> Counter[str]:
    return Counter(row.outcome.verdict for row in rows)


def write(out: Path, workflow: str, rows: list[Row], wall_s: float) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    counts = totals(rows)
    document = {
        "workflow": workflow,
        "tested_at": max((r.outcome.tested_at for r in rows), default=""),
        "seconds": round(wall_s, 1),
        "totals": {v: counts.get(v, 0) for v in ("PASS", "FAIL", "CANNOT_DETERMINE")},
        "cells": [row.as_json() for row in rows],
    }
    as_json = out / "matrix.json"
    as_json.write_text(json.dumps(document, indent=2) + "\n")
    as_md = out / "matrix.md"
    as_md.write_text(markdown(workflow, rows, document))
    return as_md, as_json


def _cell_text(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(workflow: str, rows: list[Row], document: dict[str, Any]) -> str:
    totals_ = document["totals"]
    lines = [
        "# FAILURE-INJECTION MATRIX",
        "",
        f"Workflow: `{_cell_text(workflow)}`  ",
        f"Date: {document['tested_at'][:10]} (full pass in {document['seconds']:g} s: "
        f"{totals_['PASS']} PASS, {totals_['FAIL']} FAIL, "
        f"{totals_['CANNOT_DETERMINE']} CANNOT DETERMINE)",
        "",
        "Filled by `sidecar matrix`: each cell injected its failure with a real signal to a "
        "real process, resumed the task as new attempts until the agent finished, and "
        "checked the sidecar's records (and `--check`).",
        "",
        "| Stage (effect) | Failure Point | Side Effect at Risk | Expected Recovery Behavior "
        "| Seed row | Tested? |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        cell = row.cell
        lines.append(
            "| "
            + " | ".join(
                _cell_text(text)
                for text in (
                    f"{cell.effect.label}",
                    cell.fault.failure_point,
                    f"`{cell.effect.key}`",
                    cell.fault.expected,
                    cell.fault.seed_row,
                    row.tested,
                )
            )
            + " |"
        )
    failed = [row for row in rows if row.outcome.verdict != PASS]
    if failed:
        lines += ["", "## Evidence of the cells that did not pass", ""]
        for row in failed:
            lines.append(f"- **{row.cell.effect.label} x {row.cell.fault.name}** "
                         f"({row.outcome.verdict}, task `{row.cell.task}`):")  # fmt: skip
            lines += [f"  - {_cell_text(item)}" for item in row.outcome.evidence]
    return "\n".join(lines) + "\n"
