"""The checkout's `./run`: `sidecar` and `python` run in the caller's directory, so the
relative paths a user gives them (a rule file, an agent script, `psql -f dump.sql` under
`sidecar exec`) are the user's, wherever the checkout is."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUN = str(REPO / "run")


def run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RUN, *argv], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def test_sidecar_reads_a_rule_file_named_relative_to_the_callers_directory(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "version: 1\nrules:\n  - name: mine.load\n    match: {sql: {kind: [COPY]}}\n"
        "    effect: non_idempotent\n"
    )
    done = run(tmp_path, "sidecar", "rules", "check", "mine.yaml")
    assert done.returncode == 0, done.stderr
    assert "mine.yaml: 1 rule ok" in done.stdout


def test_python_runs_in_the_callers_directory(tmp_path):
    done = run(tmp_path, "python", "-c", "import os; print(os.getcwd())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path)
