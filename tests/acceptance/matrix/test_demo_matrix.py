"""`sidecar demo --matrix`: the reference agent's matrix on the GitHub emulator."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import run_sidecar

pytestmark = pytest.mark.acceptance


def demo_matrix(out: Path, fault: str) -> list[dict[str, Any]]:
    """``sidecar demo --matrix`` with one fault into ``out``; its cells, all passed."""
    done = run_sidecar("demo", "--matrix", "--faults", fault, "--out", str(out), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    cells: list[dict[str, Any]] = json.loads((out / "matrix.json").read_text())["cells"]
    assert {c["verdict"] for c in cells} == {"PASS"}
    return cells


@pytest.mark.timeout(600)
def test_the_reference_agents_matrix_is_filled_on_the_emulator(tmp_path: Path) -> None:
    cells = demo_matrix(tmp_path / "out", "sidecar-killed-after-record")
    assert [c["rule"] for c in cells] == [
        "openai.chat.completions",
        "github.git.push",
        "github.pulls.create",
        "github.issues.comments.create",
    ]
    # each cell counted its branch, pull request and comment on the emulator
    assert all(
        any("1 branch(es), 1 pull request(s), 1 comment(s)" in e for e in c["evidence"])
        for c in cells
    )


@pytest.mark.timeout(600)
def test_an_agent_killed_in_a_cell_leaves_its_temporary_files_with_the_cell(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    demo_matrix(out, "agent-killed-after-forward")
    # The push's cell kills the agent while its clone (under TMPDIR) still exists: the
    # clone is left with the cell, not in /tmp.
    left = sorted((out / "cells").glob("*/agent-tmp/agent-*/repo/.git"))
    assert [path.parts[-5] for path in left] == ["002-e2-agent-killed-after-forward"]
