"""Store outages with real processes: SPEC §3.4 and the last row of the seed's failure
matrix ("checkpoint store temporarily unavailable: retry with backoff; do NOT proceed
without a record").

A real `sidecar serve` proxies an agent's calls to the counting upstream.  While its
store cannot record - the PostgreSQL server stopped, the SQLite volume full, the SQLite
file locked by another process - a matched effect is not forwarded: the record is tried
again with backoff for ``--store-retry-s``, then the agent gets 503 ``store_unavailable``.
Reads and idempotent calls keep flowing, /readyz says not ready.  When the store is back,
/readyz is ready again, new effects go through, and every effect acknowledged before the
outage is still in the store.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.outages import (
    HELD,
    HOSTS,
    PG_DURABLE,
    PG_HBA,
    Agent,
    CannotMount,
    DiskFull,
    Outage,
    PgServerDown,
    Reply,
    SqliteLocked,
    Volume,
    VolumeKind,
    outage,
    pg_store_url,
    posts,
    release_held,
    wait_until,
    write_rules,
)
from tests.support.pgcluster import PgCluster, private_cluster
from tests.support.stack import Stack

pytestmark = pytest.mark.acceptance

TASK = "312"
# A store outage answers within the bound plus one store call that started just before the
# deadline (PostgreSQL: 1 s waiting for a connection; SQLite: its 5 s busy timeout).
LATE_S = 8.0
# Once the store is back, the next readiness probe (and write) must find it.
READY_AGAIN_S = 5.0


def key(name: str) -> str:
    return f"acme/app#thing:{name}"


@pytest.fixture
def stacks(tmp_path: Path) -> Iterator[list[Stack]]:
    started: list[Stack] = []
    yield started
    for stack in started:
        stack.close()


def start(stacks: list[Stack], root: Path, *args: str) -> Agent:
    """A stack (upstream + `sidecar serve ARGS`) and an agent holding task 312 on it."""
    stack = Stack.start(root / "stack", rules=[write_rules(root)], hosts=HOSTS, sidecar_args=args)
    stacks.append(stack)
    agent = Agent(stack, TASK)
    agent.claim()
    return agent


# ---- the checks every outage gets --------------------------------------------------------


def acknowledge(agent: Agent, *names: str) -> list[str]:
    """Effects that went through: the agent got 201 for each.  Their keys."""
    for name in names:
        answer = agent.create(name)
        assert (answer.status, answer.disposition) == (201, "recorded"), answer
    return [key(name) for name in names]


def fails_closed(agent: Agent, name: str, bound_s: float, *, tries: int, why: str) -> Reply:
    """During the outage: the effect ``name`` is refused after the retry bound (the store
    said ``why``) and not forwarded; reads and idempotent calls pass; /readyz is not
    ready."""
    stack = agent.stack
    forwarded = posts(stack)
    refused = agent.create(name)
    assert refused.status == 503, refused
    assert refused.code == "store_unavailable", refused
    assert refused.headers["content-type"].startswith("application/problem+json")
    assert refused.disposition == "refused"
    assert why in refused.body["detail"], refused
    assert posts(stack) == forwarded, "an effect was forwarded without a record"
    assert bound_s <= refused.seconds < bound_s + LATE_S, refused.seconds
    failed = agent.failed_records(key(name))
    assert len(failed) >= tries, f"record tried {len(failed)} times within {bound_s}s"

    read = agent.read("before-1")
    assert read.status == 200, read
    assert [t["name"] for t in read.body] == ["before-1"]
    done = agent.put_idempotent("during")
    assert done.status == 201, done
    assert posts(stack, "/effects/during") == 1

    ready = agent.readiness()
    assert ready.status == 503, ready
    assert ready.code == "store_unavailable", ready
    assert posts(stack) == forwarded
    print(
        f"outage: refused after {refused.seconds:.2f}s (bound {bound_s}s, {len(failed)} tries),"
        f" /readyz 503 after {ready.seconds:.2f}s"
    )
    return refused


def recovers(agent: Agent, acknowledged: list[str], refused: str) -> None:
    """After the outage: ready again soon, new effects go through and are recorded, the
    refused one goes through once when tried again, nothing acknowledged is missing."""
    stack = agent.stack
    waited = agent.wait_readiness(True, timeout_s=READY_AGAIN_S)
    forwarded = posts(stack)
    after = agent.create("after")
    assert (after.status, after.disposition) == (201, "recorded"), (after, waited)
    again = agent.create(refused)
    assert (again.status, again.disposition) == (201, "recorded"), again
    assert posts(stack) == forwarded + 2

    effects = agent.effects()
    for logged in [*acknowledged, key("after"), key(refused)]:
        assert effects[logged]["state"] == "completed", effects[logged]
        assert effects[logged]["response"]["status"] == 201
    assert set(effects) == {*acknowledged, key("after"), key(refused)}
    print(f"outage: ready again {waited:.2f}s after the store was back")
    # Every effect reached the upstream exactly once: the ones acknowledged before, the
    # one refused during the outage only after it.
    before = [logged.rpartition(":")[2] for logged in acknowledged]
    assert sorted(t["name"] for t in stack.things()) == sorted([*before, "after", refused])


def outage_then_recovery(
    agent: Agent, what: Outage, bound_s: float, *, tries: int, why: str
) -> None:
    acknowledged = acknowledge(agent, "before-1", "before-2", "before-3")
    with outage(what):
        fails_closed(agent, "during", bound_s, tries=tries, why=why)
    recovers(agent, acknowledged, "during")


# ---- PostgreSQL ------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[PgCluster]:
    """A private PostgreSQL cluster this test may stop and start (the shared server must
    never be stopped).  Commits are synchronous: an immediate stop loses none."""
    pg = private_cluster(tmp_path / "pg", hba=PG_HBA, settings=PG_DURABLE)
    try:
        pg.sql("CREATE DATABASE effects")
        yield pg
    finally:
        pg.stop()


def test_postgresql_server_stopped_fails_closed_and_recovers(
    cluster: PgCluster, stacks: list[Stack], tmp_path: Path
) -> None:
    bound = 2.0
    agent = start(
        stacks, tmp_path, "--store", pg_store_url(cluster, "effects"), "--store-retry-s", str(bound)
    )
    ready = agent.readiness()
    assert ready.status == 200
    assert ready.body["store"]["backend"] == "postgresql"
    assert ready.body["store"]["durable"] is True
    # Each try waits up to 1 s for a connection: within 2 s there are two or three.
    outage_then_recovery(
        agent, PgServerDown(cluster), bound, tries=2, why="couldn't get a connection"
    )


def test_postgresql_back_after_a_long_outage_is_used_at_once(
    cluster: PgCluster, stacks: list[Stack], tmp_path: Path
) -> None:
    """Probed for readiness all through a 20 s outage (as Kubernetes does), the sidecar
    uses the server again within seconds of its return - not only when the connection
    pool's reconnection back-off (1 s, 2 s, 4 s, ... grown all through the outage) next
    tries, which would refuse effects for about half as long again as the outage."""
    agent = start(stacks, tmp_path, "--store", pg_store_url(cluster, "effects"))
    acknowledged = acknowledge(agent, "before-1")
    with outage(PgServerDown(cluster)):
        until = time.monotonic() + 20
        while time.monotonic() < until:
            assert agent.readiness().status == 503
            time.sleep(0.5)  # the probe period
    waited = agent.wait_readiness(True, timeout_s=READY_AGAIN_S)
    print(f"outage: ready again {waited:.2f}s after the server was back")
    after = agent.create("after")
    assert (after.status, after.disposition) == (201, "recorded"), after
    assert set(agent.effects()) == {*acknowledged, key("after")}


def test_postgresql_stopped_before_the_answer_is_recorded(
    cluster: PgCluster, stacks: list[Stack], tmp_path: Path
) -> None:
    """The effect was recorded and forwarded; the upstream's answer cannot be recorded.
    The agent is not told it succeeded (503); the effect stays pending in the log, and
    when the agent tries again after the outage the probe finds it: sent once, completed
    from the evidence."""
    bound = 1.0
    agent = start(
        stacks, tmp_path, "--store", pg_store_url(cluster, "effects"), "--store-retry-s", str(bound)
    )
    stack = agent.stack
    held = "held#thing:h"
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(agent.create_held, "h")
        wait_until(lambda: posts(stack, HELD) == 1, "the effect reached the upstream")
        assert agent.effects()[held]["state"] == "pending"  # recorded before it was sent
        with outage(PgServerDown(cluster)):
            release_held(stack)  # the upstream answers 201 while the store is down
            answer = first.result(timeout=60)
            assert answer.status == 503, answer
            assert answer.code == "store_unavailable", answer
            assert answer.seconds >= bound

    agent.wait_readiness(True, timeout_s=READY_AGAIN_S)
    assert agent.effects()[held]["state"] == "pending"  # its outcome was never recorded
    again = agent.create_held("h")
    assert (again.status, again.disposition) == (201, "probed"), again
    assert again.body["name"] == "h"
    assert posts(stack, HELD) == 1, "sent a second time"
    effect = agent.effects()[held]
    assert effect["state"] == "completed"
    assert effect["detail"] == "completed from evidence in the outside world"


# ---- SQLite ----------------------------------------------------------------------------


@pytest.fixture(params=["tmpfs", "ext4-loop"])
def volume(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Volume]:
    """A small file system of the test's own for the SQLite store (mounting needs root)."""
    kind: VolumeKind = request.param
    try:
        mounted = Volume.mount(tmp_path / "volume", kind, size_bytes=16 << 20)
    except CannotMount as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the disk-full outage tests: {error}")
        pytest.skip(f"cannot make a size-limited {kind} file system here: {error}")
    yield mounted
    mounted.unmount()


def test_sqlite_volume_full_fails_closed_and_recovers(
    volume: Volume, stacks: list[Stack], tmp_path: Path
) -> None:
    bound = 2.0
    store = f"sqlite:///{volume.path}/effects.db"
    # `stacks` is torn down before `volume`: the sidecar has exited when it is unmounted.
    agent = start(stacks, tmp_path, "--store", store, "--store-retry-s", str(bound))
    full = DiskFull(volume)
    acknowledged = acknowledge(agent, "before-1", "before-2", "before-3")
    with outage(full):
        assert volume.available() == 0
        fails_closed(agent, "during", bound, tries=5, why="database or disk is full")
        # Each try fails at once; the pauses between them grow (0.05 s, 0.1 s, 0.2 s,
        # 0.4 s, each with up to 50 % jitter either way).
        tries = agent.failed_records(key("during"))
        gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(tries)]
        assert gaps[3] > gaps[0], gaps
    assert full.filled_bytes > 0
    recovers(agent, acknowledged, "during")


def test_sqlite_file_locked_by_another_process_fails_closed_and_recovers(
    stacks: list[Stack], tmp_path: Path
) -> None:
    # One try waits out the store's busy timeout (5 s) for the lock; a bound of 6 s
    # leaves room for a second.
    bound = 6.0
    agent = start(stacks, tmp_path, "--store-retry-s", str(bound))
    locked = SqliteLocked(agent.stack.data_dir / "effects.db", log=tmp_path / "locker.log")
    outage_then_recovery(agent, locked, bound, tries=2, why="database is locked")
