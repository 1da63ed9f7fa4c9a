"""Stopping ``sidecar serve`` while agents are connected to its PostgreSQL relay.

A real SIGTERM to the sidecar process, with one agent connection idle and another in
the middle of a recorded statement: the sidecar exits (code 0) within the relay's grace
and its other bounded steps, the idle connection closed at once and the busy one after
the grace; nothing of the cut statement commits.  Before, the sidecar waited for every
agent to disconnect, and with an agent's connection open never exited at all.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from urllib.parse import quote

import psycopg
import pytest

from sidecar.pgwire.relay import STOP_GRACE_S
from tests.acceptance.pgwire.conftest import MakeWorld
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
    assert "closing 1 PostgreSQL connection(s) still busy" in [e["msg"] for e in _log(world)]


def test_with_task_the_statements_are_ended_before_the_lease_is_released(
    make_world: MakeWorld,
) -> None:
    """`serve --task` holds the lease itself: a statement of its attempt running at
    SIGTERM is ended while the attempt still holds the lease, then the lease goes."""
    world = make_world(sidecar_args=["--task", TASK, "--worker", "serve-worker"])
    url = f"{world.client_url()}?options={quote(f'-c sidecar.task={TASK}')}"
    with psycopg.connect(url, autocommit=True) as busy:
        napping = threading.Thread(
            target=lambda: _swallow(busy, "/* sidecar:key=nap */ SELECT pg_sleep(60)")
        )
        napping.start()
        time.sleep(0.5)
        assert world.process.terminate(timeout=30) == 0
        napping.join(timeout=10)
    said = [entry["msg"] for entry in _log(world)]
    assert said.index("closing 1 PostgreSQL connection(s) still busy") < said.index("release ok")


def _swallow(connection: psycopg.Connection[tuple[object, ...]], sql: str) -> None:
    with contextlib.suppress(psycopg.Error):
        connection.execute(sql)


def _log(world: PostgresWorld) -> list[dict[str, object]]:
    lines = (world.root / "sidecar-1.log").read_text().splitlines()
    return [json.loads(line) for line in lines]
