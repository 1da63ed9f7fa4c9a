"""TLS from the agent to the relay, and from the relay to the server, with real clients.

A private cluster with ``ssl = on`` (``tests.support.pgcluster``: a self-signed
certificate for ``localhost``), a real `sidecar serve --pg-upstream
postgresql://localhost:PORT --pg-upstream-ca server.crt` in front of it, and agents that
ask for TLS as users do: psql with ``sslmode=require`` and with ``sslmode=verify-full``
(``PGSSLROOTCERT``, which `sidecar exec` sets to the sidecar's bundle), psycopg and
asyncpg.  The relay presents a certificate of the sidecar's own CA for the name asked
for, and speaks TLS to the server because the agent asked for it.

Skipped where PostgreSQL is not installed, except on CI (``CI=true``), where it fails.
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psycopg
import pytest

from sidecar.rules.packs import packs_dir
from tests.acceptance.pgwire.conftest import HERE, events
from tests.acceptance.pgwire.test_migration_script import MIGRATION, SCHEMA
from tests.support.pgcluster import PgCluster, private_cluster
from tests.support.postgres import PostgresWorld, ScratchDatabase

pytestmark = pytest.mark.acceptance

SSL_OF_BACKEND = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgCluster]:
    """TLS on, trust for everyone over TCP, with or without TLS (the tests look at which)."""
    hba = ["hostssl all all 127.0.0.1/32 trust", "hostnossl all all 127.0.0.1/32 trust"]
    pg = private_cluster(tmp_path_factory.mktemp("pg"), hba=hba)
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture(scope="module")
def server_ca(cluster: PgCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cluster's self-signed certificate: the CA the relay checks the server with."""
    path = tmp_path_factory.mktemp("server-ca") / "server.crt"
    shutil.copyfile(cluster.data / "server.crt", path)
    return path


@pytest.fixture
def world(cluster: PgCluster, server_ca: Path, tmp_path: Path) -> Iterator[PostgresWorld]:
    """A scratch database on the cluster (named ``localhost``, as its certificate says),
    the sidecar in front of it with the SQL rules, checking the server with ``server_ca``."""
    admin = f"postgresql://admin@localhost:{cluster.port}/postgres"
    database = ScratchDatabase.create(admin)
    world = PostgresWorld(
        tmp_path, database, [packs_dir() / "postgres.yaml", HERE / "app-rules.yaml"]
    )
    world.sidecar_args = ["--pg-upstream-ca", str(server_ca)]
    try:
        world.start_sidecar()
    except BaseException:
        database.drop()
        raise
    world.rows(SCHEMA)
    yield world
    world.close()


def bundle(world: PostgresWorld) -> str:
    """The trust bundle `sidecar exec` hands its agents (system roots + the sidecar's CA)."""
    return str(world.root / "sidecar" / "ca-bundle.pem")


def relay_port(world: PostgresWorld) -> int:
    port = urlsplit(world.pg).port
    assert port is not None
    return port


def agent_logs(world: PostgresWorld) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(world.root.glob("agent-*.log")))


def migrate_twice(world: PostgresWorld, migration: Path, conninfo: str) -> None:
    """The migration as two attempts of task 312 under `sidecar exec`; applied once."""
    psql = ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", str(migration)]
    first = world.agent("worker-a", *psql)
    assert first.wait(timeout=60) == 0, agent_logs(world)
    second = world.agent("worker-b", *psql)
    assert second.wait(timeout=60) == 0, agent_logs(world)
    assert first.lines == second.lines == ["ALTER TABLE", "CREATE INDEX", "INSERT 0 3"]
    assert world.value("SELECT count(*) FROM order_statuses") == 3
    assert (
        world.value(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'orders' AND column_name = 'status'"
        )
        == 1
    )
    effects = world.settled_effects()
    assert len(effects) == 3
    for effect in effects:
        assert effect["state"] == "completed"
        assert events(effect)[:2] == ["pending", "completed"]
        assert "replayed" in events(effect)


@pytest.fixture
def migration(tmp_path: Path) -> Path:
    path = tmp_path / "0042_order_status.sql"
    path.write_text(MIGRATION)
    return path


def test_psql_with_sslmode_require_migrates_once_over_tls(
    world: PostgresWorld, migration: Path
) -> None:
    migrate_twice(world, migration, "sslmode=require")


def test_psql_with_sslmode_verify_full_migrates_once_trusting_the_bundle_exec_names(
    world: PostgresWorld, migration: Path
) -> None:
    """`sidecar exec` sets PGSSLROOTCERT to its bundle: nothing else is configured."""
    migrate_twice(world, migration, "sslmode=verify-full host=localhost")


def psql(world: PostgresWorld, conninfo: str, sql: str) -> subprocess.CompletedProcess[str]:
    """psql through the relay, outside `sidecar exec` (nothing of the sidecar's set)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    target = f"port={relay_port(world)} user=admin dbname={world.database.name} {conninfo}"
    return subprocess.run(
        ["psql", "-X", "-A", "-t", "-d", target, "-c", sql],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("conninfo", "server_tls"),
    [
        ("host=127.0.0.1 sslmode=require", "t"),
        ("host=localhost sslmode=verify-full sslrootcert={bundle}", "t"),
        ("host=127.0.0.1 sslmode=verify-full sslrootcert={bundle}", "t"),  # an IP SAN
        ("host=127.0.0.1", "t"),  # libpq's default, sslmode=prefer, asks for TLS
        ("host=127.0.0.1 sslmode=disable", "f"),  # not asked: as before, plaintext
    ],
)
def test_the_relay_speaks_tls_to_the_server_when_the_agent_asked_for_it(
    world: PostgresWorld, conninfo: str, server_tls: str
) -> None:
    done = psql(world, conninfo.format(bundle=bundle(world)), SSL_OF_BACKEND)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == server_tls


def test_verify_full_against_a_wrong_name_fails_with_libpqs_own_error(
    world: PostgresWorld,
) -> None:
    """Without SNI (sslsni=0) the relay presents the address connected to, not the name."""
    conninfo = (
        f"host=db.wrong hostaddr=127.0.0.1 sslsni=0 sslmode=verify-full sslrootcert={bundle(world)}"
    )
    done = psql(world, conninfo, "SELECT 1")
    assert done.returncode == 2
    assert (
        'server certificate for "127.0.0.1" (and 1 other name) does not match host name "db.wrong"'
        in done.stderr
    )


def test_verify_full_with_roots_that_lack_the_sidecars_ca_fails_with_libpqs_own_error(
    world: PostgresWorld, server_ca: Path
) -> None:
    done = psql(world, f"host=localhost sslmode=verify-full sslrootcert={server_ca}", "SELECT 1")
    assert done.returncode == 2
    assert "certificate verify failed" in done.stderr


def test_psycopg_with_verify_full_replays_a_statement_to_the_next_attempt(
    world: PostgresWorld,
) -> None:
    world.rows("CREATE TABLE ledger_entries (id integer PRIMARY KEY, memo text NOT NULL)")
    for _ in range(2):
        attempt = world.claim("312")
        with psycopg.connect(
            host="localhost", port=relay_port(world), user="admin", dbname=world.database.name,
            sslmode="verify-full", sslrootcert=bundle(world), options=attempt.pgoptions,
            autocommit=True,
        ) as connection:  # fmt: skip
            assert connection.pgconn.ssl_in_use
            assert connection.execute(SSL_OF_BACKEND).fetchone() == (True,)
            cursor = connection.execute(
                "INSERT INTO ledger_entries (id, memo) VALUES (%s, %s) RETURNING id", (1, "charge")
            )
            assert cursor.fetchall() == [(1,)]
    assert world.rows("SELECT id, memo FROM ledger_entries") == [(1, "charge")]
    (effect,) = world.settled_effects()
    assert "replayed" in events(effect)


async def test_asyncpg_with_an_ssl_context_trusting_the_bundle(world: PostgresWorld) -> None:
    context = ssl.create_default_context(cafile=bundle(world))  # verifies name and chain
    attempt = world.claim("312")
    connection = await asyncpg.connect(
        host="localhost", port=relay_port(world), user="admin", database=world.database.name,
        ssl=context, timeout=10,
        server_settings={"sidecar.task": attempt.task, "sidecar.attempt": attempt.attempt_id},
    )  # fmt: skip
    try:
        assert await connection.fetchval(SSL_OF_BACKEND) is True
        assert connection.get_settings().server_version  # a live session
    finally:
        await connection.close()


def test_a_server_without_tls_answers_n_through_the_relay(
    postgres_server: str, tmp_path: Path
) -> None:
    """The machine's server has ssl off: an agent that requires TLS is told by libpq, as
    it would be by the server itself; one that merely prefers it goes on in plaintext."""
    world = PostgresWorld.start(tmp_path / "plain")
    try:
        required = psql(world, "host=127.0.0.1 sslmode=require", "SELECT 1")
        assert required.returncode == 2
        assert "server does not support SSL, but SSL was required" in required.stderr
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        user = urlsplit(world.database.admin_url).username or "postgres"
        preferred = subprocess.run(
            ["psql", "-X", "-A", "-t", "-d",
             f"host=127.0.0.1 port={relay_port(world)} user={user} dbname={world.database.name}",
             "-c", SSL_OF_BACKEND],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert preferred.returncode == 0, preferred.stderr
        assert preferred.stdout.strip() == "f"
    finally:
        world.close()
