"""A real process writing checkpoints is SIGKILLed again and again: nothing acknowledged is lost.

Each round starts ``tests.support.checkpoint_writer`` (16 concurrent writers, so kills
land inside group-committed batches), kills it with SIGKILL after a random delay, then
opens the database cold: it must pass ``PRAGMA integrity_check`` and hold every
checkpoint whose acknowledgement the writer printed before it died.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from contextlib import closing

import pytest

from sidecar.testing.processes import Child

pytestmark = pytest.mark.acceptance

ROUNDS = 24


def _stored(path) -> tuple[str, list[tuple[int, str]]]:
    with closing(sqlite3.connect(path)) as db:
        (integrity,) = db.execute("PRAGMA integrity_check").fetchone()
        rows = db.execute(
            "SELECT seq, stage FROM checkpoints WHERE task = 'crash' ORDER BY seq"
        ).fetchall()
    return integrity, rows


def test_every_acknowledged_checkpoint_survives_sigkill(tmp_path):
    seed = int(os.environ.get("CRASH_SEED", time.time_ns() % 10_000))
    rng = random.Random(seed)
    path = tmp_path / "effects.db"
    acknowledged: set[tuple[int, str]] = set()
    for round_no in range(ROUNDS):
        child = Child.python(
            "tests.support.checkpoint_writer",
            "--store",
            f"sqlite:///{path}",
            "--task",
            "crash",
            "--concurrency",
            "16",
            stderr_path=tmp_path / "writer.err",
        )
        with child:
            child.wait_for(r"^ready ", timeout=30)
            time.sleep(rng.uniform(0.0, 0.3))
            status = child.kill()
        assert status == -9, f"round {round_no}: the writer was not killed by SIGKILL"
        for line in child.lines:
            if line.startswith("ack "):
                _, seq, stage = line.split(" ", 2)
                acknowledged.add((int(seq), stage))

        integrity, rows = _stored(path)
        assert integrity == "ok", f"seed {seed} round {round_no}: {integrity}"
        stored = set(rows)
        lost = acknowledged - stored
        assert not lost, f"seed {seed} round {round_no}: acknowledged but lost: {sorted(lost)[:5]}"
        seqs = [seq for seq, _ in rows]
        assert seqs == list(range(1, len(seqs) + 1)), "checkpoint numbers have a gap"

    assert len(acknowledged) > ROUNDS * 10, "the writer barely wrote: the test proved little"
