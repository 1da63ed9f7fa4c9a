"""COPY under a rule that records it, as psql users run it, through ``sidecar serve``.

psql's ``\\copy`` streams the rows through the connection (COPY ... FROM STDIN), which a
record cannot hold: psql gets the sidecar's reason at once and exits 1, nothing loaded.
(Before, psql and the server waited for each other for ever, the transaction holding
its locks, and the sidecar would not stop.)  A COPY on the server's side runs once per
task: the attempt after answers from its record.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.acceptance.pgwire.conftest import MakeWorld
from tests.support.postgres import TASK, PostgresWorld

pytestmark = pytest.mark.acceptance

RULES = """
version: 1
rules:
  - name: load.parts
    description: Loading the parts list happens once per task.
    match: {sql: {kind: [COPY], regex: "\\\\bparts\\\\b"}}
    effect: non_idempotent
"""


@pytest.fixture
def world(make_world: MakeWorld, tmp_path: Path) -> PostgresWorld:
    rules = tmp_path / "copy-rules.yaml"
    rules.write_text(RULES)
    made = make_world(rules=[rules])
    made.rows("CREATE TABLE parts (id int, name text)")
    return made


def psql(world: PostgresWorld, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """psql through the sidecar, as one new attempt of the task."""
    attempt = world.claim(TASK)
    env = os.environ | world.agent_env() | {"PGOPTIONS": attempt.pgoptions}
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", command],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_psqls_copy_from_a_local_file_is_refused_with_the_reason(
    world: PostgresWorld, tmp_path: Path
) -> None:
    (tmp_path / "parts.tsv").write_text("1\tbolt\n2\tnut\n")
    done = psql(world, "\\copy parts FROM 'parts.tsv'", tmp_path)
    assert done.returncode == 1
    assert "rule load.parts matches this COPY" in done.stderr
    assert "load the rows with INSERT" in done.stderr
    assert world.rows("SELECT * FROM parts") == []
    assert world.recorded() == {}


def test_a_copy_the_server_runs_is_loaded_once_per_task(
    world: PostgresWorld, tmp_path: Path
) -> None:
    load = "COPY parts FROM PROGRAM 'printf \"1\\tbolt\\n2\\tnut\\n\"'"
    first, again = psql(world, load, tmp_path), psql(world, load, tmp_path)
    assert (first.returncode, again.returncode) == (0, 0)
    assert first.stdout == again.stdout == "COPY 2\n"
    assert world.rows("SELECT id, name FROM parts ORDER BY id") == [(1, "bolt"), (2, "nut")]
    assert list(world.recorded().values()) == ["COPY 2"]
