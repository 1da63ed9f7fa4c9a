"""``postgresql://...``: the shared store, for many sidecars on many nodes.

Same commands, same rules and same rows as the SQLite store; what differs is how a
batch of commands becomes one transaction that many processes can run at once:

* every write batch first takes a transaction-scoped advisory lock per task it touches
  (``lock_tasks``), in key order.  Two sidecars deciding about the same task therefore
  take turns, and the loads that follow the lock see every write committed before it (READ
  COMMITTED takes a fresh snapshot per statement), so a claim, a heartbeat or a fenced
  write decides on the newest state and writes in the same transaction;
* writes are group-committed (:mod:`.group_commit`) over a few lanes on pooled
  connections; PostgreSQL's ``synchronous_commit`` (on by default) makes a commit durable
  before it is acknowledged, and :meth:`PostgresStore.info` reports it when it is off;
* every error of the driver, the pool or the network is turned into
  :class:`~sidecar.errors.StoreUnavailable` in :meth:`PostgresStore._database`, and
  nowhere else: the callers fail closed on it (a broken invariant - an integrity error -
  is a bug and raises as itself; a value the server cannot take is
  :class:`~sidecar.errors.UnstorableValue`, which the group commit isolates).

Tables live in their own PostgreSQL schema (``effect_sidecar`` unless the URL says
``?schema=NAME``), so the store can share a database with the application it guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
import psycopg_pool
from psycopg import sql

from sidecar.domain.ids import new_attempt_id
from sidecar.errors import ConfigError, StoreUnavailable, UnstorableValue
from sidecar.runtime.clock import Clock
from sidecar.store import sqlfiles
from sidecar.store.base import StoreInfo
from sidecar.store.batch import Batch, Work, changes, decide, wanted
from sidecar.store.commands import Context
from sidecar.store.group_commit import GroupCommit, GroupCommitStore
from sidecar.store.sql_reads import SQLReads

log = logging.getLogger(__name__)

Q = sqlfiles.named_statements("postgresql")
DEFAULT_SCHEMA = "effect_sidecar"
LANES = 4
MAX_BATCH = 256
# A batch that lost a deadlock or serialization race is run again, this many times.
RACE_RETRIES = 3
# Serialises migrations of every sidecar on the server (an arbitrary, fixed lock key).
MIGRATION_LOCK = 0x5EC0_0312
# The pool's reconnection attempts back off (1 s, 2 s, 4 s, ...); after this long they
# stop, and the next write starts afresh with an immediate attempt.  Left at the pool's
# default (5 minutes) the back-off grows all through an outage, and a server that is
# back stays unused until the next attempt: about half as long again as the outage.
RECONNECT_S = 2.0


def split_url(url: str) -> tuple[str, str]:
    """``(libpq URL without our parameters, schema name)`` of a store URL."""
    parts = urlsplit(url)
    if parts.scheme not in {"postgres", "postgresql"} or not parts.path.strip("/"):
        raise ConfigError(
            f"not a PostgreSQL store URL (want postgresql://USER@HOST:PORT/DATABASE): {url!r}"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = next((v for k, v in query if k == "schema"), DEFAULT_SCHEMA)
    if not schema.isidentifier():
        raise ConfigError(f"store URL schema={schema!r} is not a plain identifier")
    rest = urlencode([(k, v) for k, v in query if k != "schema"])
    return urlunsplit(parts._replace(query=rest)), schema


def redacted(url: str) -> str:
    """The URL with its password, if any, replaced: it is printed and logged."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class PostgresStore(SQLReads, GroupCommitStore):
    _closed = "the PostgreSQL store is not open for writing"

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        new_attempt_id: Callable[[], str] = new_attempt_id,
        read_only: bool = False,
        connect_timeout_s: float = 2.0,
        wait_for_connection_s: float = 1.0,
        operation_timeout_s: float = 5.0,
        pool_size: int = LANES + 4,
    ) -> None:
        super().__init__(redacted(url), clock=clock, new_attempt_id=new_attempt_id)
        self._conninfo, self.schema = split_url(url)
        self._read_only = read_only
        self._connect_timeout_s = connect_timeout_s
        self._wait_for_connection_s = wait_for_connection_s
        self._operation_timeout_s = operation_timeout_s
        self._pool_size = pool_size
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Any]] | None = None
        self._schema_version = 0
        self._durable = True

    # ---- lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        options = f"-c search_path={self.schema}"
        self._pool = psycopg_pool.AsyncConnectionPool(
            self._conninfo,
            min_size=1,
            max_size=self._pool_size,
            open=False,
            # autocommit: reads need no transaction; writes open one explicitly.
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, round(self._connect_timeout_s)),
                # A server that vanishes without a word (a network cut, not a restart)
                # breaks the connection after this long instead of TCP's minutes.
                "tcp_user_timeout": int(self._operation_timeout_s * 1000),
                "keepalives_idle": 5,
                "options": options,
                "application_name": "effect-sidecar",
            },
            # A connection that died while idle (server restart, network cut) is replaced
            # before use instead of failing the write that drew it.
            check=psycopg_pool.AsyncConnectionPool.check_connection,
            # While the server is down, a write waits this long for a connection before
            # it is StoreUnavailable, so the proxy's retry bound (--store-retry-s) holds.
            timeout=self._wait_for_connection_s,
            reconnect_timeout=RECONNECT_S,
            name="effect-sidecar-store",
        )
        try:
            async with self._database():
                await self._pool.open(wait=True, timeout=self._connect_timeout_s + 1)
            self._schema_version = await self._prepare()
        except BaseException:
            await self.close()
            raise
        if not self._read_only:
            self._writes = GroupCommit(
                self._commit,
                name=f"postgresql:{self.url}",
                lanes=LANES,
                max_batch=MAX_BATCH,
            )
            self._writes.start()

    async def _prepare(self) -> int:
        """Migrate (or, read-only, check) the schema; the version it is at."""
        latest = sqlfiles.migrations("postgresql")[-1].version
        async with self._connection() as db:
            synchronous = await (await db.execute("SHOW synchronous_commit")).fetchone()
            self._durable = synchronous is not None and synchronous[0] != "off"
            if self._read_only:
                version = await _schema_version(db, self.schema)
                if version == 0:
                    raise StoreUnavailable(
                        f"no store at {self.url}: schema {self.schema} has no effect-sidecar "
                        "tables (schema version 0)"
                    )
                if version != latest:
                    raise StoreUnavailable(
                        f"store {self.url} (schema {self.schema}) has schema version "
                        f"{version}, this sidecar reads {latest}"
                    )
                return version
            return await migrate(db, self.schema)

    async def close(self) -> None:
        """Commit what is queued, then close the pool."""
        if self._writes is not None:
            await self._writes.stop()
            self._writes = None
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    async def info(self) -> StoreInfo:
        return StoreInfo(
            url=self.url,
            backend="postgresql",
            schema_version=self._schema_version,
            durable=self._durable,
        )

    # ---- the one place driver errors become StoreUnavailable ---------------------

    @contextlib.asynccontextmanager
    async def _database(self) -> AsyncIterator[None]:
        try:
            # No store call may hang a request: what has not finished by then has failed.
            async with asyncio.timeout(self._operation_timeout_s):
                yield
        except psycopg.IntegrityError:
            raise  # a broken invariant is a bug, not an outage
        except (psycopg.DataError, OverflowError, UnicodeError) as exc:
            # A value PostgreSQL cannot take (out of range, a NUL in text, a lone
            # surrogate): this write's fault, not the store's.
            raise UnstorableValue(f"the store cannot hold a value of this write: {exc}") from exc
        except (psycopg.Error, psycopg_pool.PoolTimeout, OSError, TimeoutError) as exc:
            why = (
                f"no answer within {self._operation_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else str(exc).strip()
            )
            log.warning("PostgreSQL store %s: %s", self.url, why)
            raise StoreUnavailable(f"PostgreSQL store {self.url} cannot be used: {why}") from exc

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self._pool is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        async with self._database(), self._pool.connection() as db:
            yield db

    # ---- writes ------------------------------------------------------------------

    async def _commit(self, works: list[Work]) -> list[Any]:
        for attempt in range(RACE_RETRIES + 1):
            try:
                async with self._connection() as db:
                    return await _commit_batch(db, works, self._context)
            except StoreUnavailable as exc:
                lost_race = isinstance(
                    exc.__cause__,
                    psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure,
                )
                if not lost_race or attempt == RACE_RETRIES:
                    raise
        raise AssertionError("unreachable")

    # ---- reads -------------------------------------------------------------------

    async def _fetch(self, name: str, params: Iterable[Any] = ()) -> list[Any]:
        async with self._connection() as db:
            cursor = await db.execute(Q[name], tuple(params))
            return await cursor.fetchall()

    @staticmethod
    def _tasks_param(tasks: Sequence[str]) -> tuple[Any, ...]:
        return (list(tasks),)

    @staticmethod
    def _effect_keys_param(keys: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
        return ([t for t, _ in keys], [k for _, k in keys])


async def _commit_batch(
    db: psycopg.AsyncConnection[Any], works: Sequence[Work], context: Callable[[], Context]
) -> list[Any]:
    """One transaction: lock the tasks, load, let the commands decide, write, commit."""
    want = wanted(works)
    async with db.transaction(), db.cursor() as cursor:
        if want.tasks:
            await cursor.execute(Q["lock_tasks"], (want.tasks,))
        # Time is read once the locks are held (they may have been waited for), so the
        # stamps of one task's writes follow the order they were decided in.
        ctx = context()

        async def rows_of(name: str, *params: list[str]) -> list[Any]:
            if not params[0]:
                return []
            await cursor.execute(Q[name], params)
            return await cursor.fetchall()

        batch = Batch.loaded(
            await rows_of("load_tasks", want.tasks),
            await rows_of("load_last_checkpoints", want.last_checkpoints),
            await rows_of(
                "load_effects", [t for t, _ in want.effects], [k for _, k in want.effects]
            ),
            await rows_of("load_task_rows", want.task_rows),
        )
        outcomes = decide(works, batch, ctx)
        for name, params in changes(batch):
            await cursor.executemany(Q[name], params)
    return outcomes


async def _schema_version(db: psycopg.AsyncConnection[Any], schema: str) -> int:
    found = await (
        await db.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{schema}.schema_version",))
    ).fetchone()
    if not found or not found[0]:
        return 0
    version = await (
        await db.execute(
            sql.SQL("SELECT version FROM {}.schema_version").format(sql.Identifier(schema))
        )
    ).fetchone()
    return int(version[0]) if version else 0


async def migrate(db: psycopg.AsyncConnection[Any], schema: str) -> int:
    """Bring ``schema`` to the newest version and return it.

    Runs the numbered migrations it lacks, in one transaction with the version row, under
    an advisory lock: sidecars starting together migrate once, the others wait and find
    the work done.
    """
    migrations = sqlfiles.migrations("postgresql")
    latest = migrations[-1].version
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await db.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        await db.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_version (version integer NOT NULL)"
            ).format(sql.Identifier(schema))
        )
        version = await _schema_version(db, schema)
        if version > latest:
            raise ConfigError(
                f"store schema version {version} is newer than this sidecar knows ({latest})"
            )
        for migration in migrations[version:]:
            log.info("applying store migration %s to schema %s", migration.name, schema)
            # The connection's search_path is the store's schema, so the files name no schema.
            await db.execute(migration.sql.encode())
        if version != latest:
            table = sql.Identifier(schema, "schema_version")
            await db.execute(sql.SQL("DELETE FROM {}").format(table))
            await db.execute(
                sql.SQL("INSERT INTO {} (version) VALUES (%s)").format(table), (latest,)
            )
    return latest
