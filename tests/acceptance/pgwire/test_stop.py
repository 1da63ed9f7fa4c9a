"""Stopping ``sidecar serve`` while agents are connected to its PostgreSQL relay.

A real SIGTERM to the sidecar process, with one agent connection idle and another in
the middle of a recorded statement: the sidecar exits (code 0) within the relay's grace
and its other bounded steps, the idle connection closed at once and the busy one after
the grace; nothing of the cut statement commits.  Before, the sidecar waited for every
agent to disconnect, and with an agent's connection open never exited at all.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest

from sidecar.pgwire.relay import STOP_GRACE_S
from tests.support.postgres import TASK, PostgresWorld

pytestmark = pytest.mark.acceptance


def test_sigterm_stops_the_sidecar_with_agents_connected(world: PostgresWorld) -> None:
    attempt = world.claim(TASK)
    cut: list[BaseException] = []
    with (
        psycopg.connect(world.client_url(attempt), autocommit=True) as idle,
        psycopg.connect(world.client_url(attempt), autocommit=True) as busy,
    ):
        assert idle.execute("SELECT 1").fetchone() == (1,)

        def nap() -> None:
            try:
                busy.execute("/* sidecar:key=nap */ SELECT pg_sleep(60)")
            except psycopg.Error as error:
                cut.append(error)

        napping = threading.Thread(target=nap)
        napping.start()
        time.sleep(0.5)  # the statement is on the server
        started = time.monotonic()
        assert world.process.terminate(timeout=30) == 0
        took = time.monotonic() - started
        napping.join(timeout=10)
        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 10
    assert len(cut) == 1
    assert isinstance(cut[0], psycopg.OperationalError)
    assert "nap" not in world.recorded()
    log = [json.loads(line) for line in (world.root / "sidecar-1.log").read_text().splitlines()]
    said = [entry["msg"] for entry in log]
    assert "closing 1 PostgreSQL connection(s) still busy" in said
