"""A data dir that lost or damaged its store refuses to start (SPEC §7).

Starting on an empty effect log would answer a resumed agent as if nothing had
happened, and every effect recorded before would be sent again.  A real `sidecar serve`
records a charge, is SIGKILLed, its store is deleted, emptied or overwritten in the
middle; the next `sidecar serve` on that data dir exits 5 naming the store, and the
upstream never sees the charge a second time.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.proxy.conftest import HOSTS, RULES, charge, run_agent
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance


@pytest.fixture
def used_stack(tmp_path: Path):
    stack = Stack.start(tmp_path / "stack", rules=RULES, hosts=HOSTS)
    try:
        (first,) = run_agent(stack, "312", "requests", [charge("order-1")])
        assert first["x-sidecar-effect"] == "recorded"
        stack.kill_sidecar()
        yield stack
    finally:
        stack.close()


def serve_again(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "sidecar", "serve", "--data-dir", str(stack.data_dir)),
            *("--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def without_wal(stack: Stack) -> Path:
    db = stack.data_dir / "effects.db"
    for side in ("effects.db-wal", "effects.db-shm"):
        (stack.data_dir / side).unlink(missing_ok=True)
    return db


@pytest.mark.parametrize("damage", ["deleted", "emptied"])
def test_a_lost_store_is_refused_not_started_empty(used_stack: Stack, damage: str):
    db = without_wal(used_stack)
    if damage == "deleted":
        db.unlink()
    else:
        db.write_bytes(b"")
    refused = serve_again(used_stack)
    assert refused.returncode == 5, refused.stderr
    assert "missing or empty" in refused.stderr
    assert str(db) in refused.stderr
    assert used_stack.counts()["charges"] == 1


def test_garbage_in_the_middle_of_the_store_is_refused(used_stack: Stack):
    db = used_stack.data_dir / "effects.db"
    # Let SQLite fold the WAL into the file first, so that the damage hits real pages.
    subprocess.run(
        [sys.executable, "-c", f"import sqlite3; sqlite3.connect({str(db)!r}).execute("
         "'PRAGMA wal_checkpoint(TRUNCATE)').close()"],
        check=True,
    )  # fmt: skip
    size = db.stat().st_size
    with db.open("r+b") as file:
        file.seek((size // 2) // 4096 * 4096)
        file.write(bytes(range(256)) * 16)
    refused = serve_again(used_stack)
    assert refused.returncode == 5, refused.stderr
    assert "damaged" in refused.stderr or "malformed" in refused.stderr
    assert used_stack.counts()["charges"] == 1


def test_an_intact_store_starts_and_replays(used_stack: Stack):
    used_stack.start_sidecar()
    (again,) = run_agent(used_stack, "312", "requests", [charge("order-1")])
    assert again["x-sidecar-effect"] == "replayed"
    assert used_stack.counts()["charges"] == 1
