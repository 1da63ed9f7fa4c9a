"""The filled matrix: the seed's table in Markdown, a row per cell in JSON."""

from __future__ import annotations

import json
from pathlib import Path

from sidecar.matrix.cell import Outcome
from sidecar.matrix.faults import BY_NAME
from sidecar.matrix.plan import Cell, EffectPoint
from sidecar.matrix.report import Row, write

PR = EffectPoint(1, "acme/app#pull:a->main", "github.pulls.create", "http", "completed", 1)


def row(number: int, fault: str, outcome: Outcome) -> Row:
    return Row(Cell(number, BY_NAME[fault], PR, f"mx-e1-{fault}", "x"), outcome)


def test_the_matrix_is_written_in_the_seeds_columns_with_a_verdict_per_cell(
    tmp_path: Path,
) -> None:
    rows = [
        row(1, "agent-killed-after-record", Outcome("PASS", ["ok"], 3.2, "2026-12-01T10:00:00")),
        row(
            2,
            "sidecar-killed-after-forward",
            Outcome("FAIL", ["duplicate: x | y was forwarded 2 times"], 4, "2026-12-01T10:01:00"),
        ),
    ]
    markdown, as_json = write(tmp_path, "python agent.py", rows, 12.0)
    text = markdown.read_text()
    assert "| Stage (effect) | Failure Point | Side Effect at Risk |" in text
    assert "| TESTED 2026-12-01 |" in text
    assert "FAIL: duplicate: x \\| y was forwarded 2 times" in text  # a | cannot break a row
    assert "Open pull request: kill after API 201, before checkpoint write" in text
    document = json.loads(as_json.read_text())
    assert document["totals"] == {"PASS": 1, "FAIL": 1, "CANNOT_DETERMINE": 0}
    first = document["cells"][0]
    assert {k: first[k] for k in ("effect", "rule", "fault", "verdict", "tested_at")} == {
        "effect": PR.key,
        "rule": "github.pulls.create",
        "fault": "agent-killed-after-record",
        "verdict": "PASS",
        "tested_at": "2026-12-01T10:00:00",
    }
    assert first["evidence"] == ["ok"]
