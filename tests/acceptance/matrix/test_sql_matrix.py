"""`sidecar matrix --pg-upstream` on a bookkeeping agent that writes with psycopg."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.acceptance.matrix.conftest import AGENTS, HERE, cells, matrix
from tests.support.postgres import ScratchDatabase

pytestmark = pytest.mark.acceptance

FAULTS = "sidecar-killed-after-forward,stale-worker,store-unavailable,upstream-timeout"


@pytest.mark.timeout(600)
def test_sql_statements_are_made_once_whatever_is_killed(
    tmp_path: Path, postgres_server: str
) -> None:
    database = ScratchDatabase.create(postgres_server)
    try:
        out = tmp_path / "out"
        done = matrix(
            "--rules", str(HERE / "ledger.yaml"),
            "--pg-upstream", database.url,
            "--check", f"{sys.executable} {AGENTS / 'ledger_check.py'} {database.url}",
            "--faults", FAULTS,
            "--out", str(out),
            "--", sys.executable, str(AGENTS / "ledger_agent.py"),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        found = cells(out)
        verdicts = {(c["effect_index"], c["fault"]): c["verdict"] for c in found}
        assert len(verdicts) == 3 * 4
        for index in (1, 2, 3):
            assert verdicts[index, "sidecar-killed-after-forward"] == "PASS"
            # the frozen worker's open transaction was rolled back at the takeover
            assert verdicts[index, "stale-worker"] == "PASS"
            assert verdicts[index, "store-unavailable"] == "PASS"
            assert verdicts[index, "upstream-timeout"] == "CANNOT_DETERMINE"
        timeout = next(c for c in found if c["fault"] == "upstream-timeout")
        assert "does not apply to SQL statements" in timeout["evidence"][0]
    finally:
        database.drop()
