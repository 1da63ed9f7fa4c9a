"""A PostgreSQL world of real processes: a scratch database on a real server, the
sidecar relaying to it, and agents run under `sidecar exec` that talk to it through
the sidecar.

    world = PostgresWorld.start(tmp)                  # database es_<hex>, sidecar in front
    world.agent("worker-a", "psql", "-f", "migrate.sql").wait()   # attempt 1 of task 312
    world.direct("psql", "-f", "migrate.sql")         # the same, straight to the server
    world.rows("SELECT count(*) FROM seeds")          # the database itself, read directly
    world.kill_sidecar(); world.start_sidecar()       # SIGKILL; same data, same ports
    world.close()                                     # and the scratch database is dropped

Agents get ``DATABASE_URL`` (and libpq's ``PGHOST``/``PGPORT``/``PGUSER``/``PGDATABASE``)
naming the sidecar's PostgreSQL port; `sidecar exec` adds the ``PGOPTIONS`` that bind
their connections to the attempt.  The server is ``$SIDECAR_TEST_POSTGRES`` (default
``postgresql://postgres@127.0.0.1:5432/test``).  Used by the acceptance tests.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

from sidecar.rules.packs import packs_dir
from sidecar.testing.processes import Child
from sidecar.testing.sidecar import HasSidecar, SidecarProcess

TASK = "312"
DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/test"


def server_url() -> str:
    return os.environ.get("SIDECAR_TEST_POSTGRES", DEFAULT_SERVER)


def unreachable(url: str | None = None) -> str | None:
    """Why the test server cannot be used (None when it can)."""
    try:
        with psycopg.connect(url or server_url(), connect_timeout=3) as connection:
            connection.execute("SELECT 1")
    except psycopg.Error as error:
        return f"PostgreSQL at {url or server_url()} is not reachable: {error}"
    return None


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


@dataclass(frozen=True)
class Attempt:
    task: str
    attempt_id: str
    generation: int

    @property
    def pgoptions(self) -> str:
        """What `sidecar exec` puts in PGOPTIONS to bind connections to this attempt."""
        return f"-c sidecar.task={self.task} -c sidecar.attempt={self.attempt_id}"


@dataclass
class ScratchDatabase:
    """A database of its own on the server, dropped (connections and all) on close."""

    name: str
    url: str
    admin_url: str

    @classmethod
    def create(cls, admin_url: str | None = None, prefix: str = "es") -> ScratchDatabase:
        admin = admin_url or server_url()
        name = f"{prefix}_{secrets.token_hex(6)}"
        with psycopg.connect(admin, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return cls(name, with_database(admin, name), admin)

    def rows(self, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
        """Run ``sql`` straight on the server (not through the sidecar); its rows."""
        with psycopg.connect(self.url, autocommit=True) as connection:
            cursor = connection.execute(sql, parameters or None)
            return cursor.fetchall() if cursor.description else []

    def value(self, sql: str, *parameters: Any) -> Any:
        (row,) = self.rows(sql, *parameters)
        return row[0]

    def drop(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


@dataclass
class PostgresWorld(HasSidecar):
    root: Path
    database: ScratchDatabase
    rules: list[Path]
    sidecar_args: list[str] = field(default_factory=list)
    agents: list[Child] = field(default_factory=list)
    process: SidecarProcess = field(init=False)

    def __post_init__(self) -> None:
        self.process = SidecarProcess(
            self.root / "sidecar", self.root, pg_upstream=self.upstream, timeout_s=10
        )

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        rules: Sequence[Path] = (),
        sidecar_args: Sequence[str] = (),
        sidecar_env: dict[str, str] | None = None,
    ) -> PostgresWorld:
        root.mkdir(parents=True, exist_ok=True)
        database = ScratchDatabase.create()
        world = cls(root, database, list(rules) or [packs_dir() / "postgres.yaml"])
        world.sidecar_args = list(sidecar_args)
        try:
            world.start_sidecar(sidecar_env)
        except BaseException:
            database.drop()
            raise
        return world

    @property
    def upstream(self) -> str:
        parts = urlsplit(self.database.admin_url)
        return f"postgresql://{parts.hostname}:{parts.port or 5432}"

    def start_sidecar(self, env: dict[str, str] | None = None) -> None:
        """Start, or restart on the same data and ports, the sidecar."""
        self.process.rules, self.process.args = self.rules, self.sidecar_args
        self.process.start(env)

    def kill_sidecar(self) -> int:
        return self.process.kill()

    def agent_env(self, *, through_sidecar: bool = True) -> dict[str, str]:
        """libpq's variables and DATABASE_URL, naming the sidecar (or the server itself)."""
        target = urlsplit(self.pg if through_sidecar else self.database.url)
        user = urlsplit(self.database.admin_url).username or "postgres"
        host, port = target.hostname or "127.0.0.1", str(target.port or 5432)
        return {
            "DATABASE_URL": f"postgresql://{user}@{host}:{port}/{self.database.name}",
            "PGHOST": host,
            "PGPORT": port,
            "PGUSER": user,
            "PGDATABASE": self.database.name,
        }

    def agent(
        self,
        worker: str,
        *argv: str,
        task: str = TASK,
        ttl_s: float = 3.0,
        wait_s: float = 30.0,
        cwd: Path | None = None,
    ) -> Child:
        """``argv`` under `sidecar exec`, as one attempt of ``task``, through the sidecar."""
        child = self.process.exec_agent(
            task, worker, argv, ttl_s=ttl_s, wait_s=wait_s, env=self.agent_env(), cwd=cwd,
            log=self.root / f"agent-{len(self.agents) + 1}-{worker}.log",
        )  # fmt: skip
        self.agents.append(child)
        return child

    def direct(self, *argv: str, cwd: Path | None = None) -> Child:
        """``argv`` straight against the server: what the agent would do with no sidecar."""
        child = Child(
            list(argv), env=os.environ | self.agent_env(through_sidecar=False), cwd=cwd,
            stderr_path=self.root / f"direct-{len(self.agents) + 1}.log",
        )  # fmt: skip
        self.agents.append(child)
        return child

    def claim(self, task: str, worker: str = "tester", ttl_s: float = 60.0) -> Attempt:
        """A new attempt of ``task`` (fencing the previous one), for clients run in-process."""
        granted = self.process.post(f"/v1/tasks/{task}/claim", {"worker": worker, "ttl_s": ttl_s})
        return Attempt(task, granted["attempt_id"], int(granted["generation"]))

    def client_url(self, attempt: Attempt | None = None) -> str:
        """A connection URL through the sidecar, bound to ``attempt`` as `sidecar exec` binds."""
        url = self.agent_env()["DATABASE_URL"]
        if attempt is None:
            return url
        return f"{url}?options={quote(attempt.pgoptions)}"

    def rows(self, sql: str, *parameters: Any) -> list[tuple[Any, ...]]:
        return self.database.rows(sql, *parameters)

    def value(self, sql: str, *parameters: Any) -> Any:
        return self.database.value(sql, *parameters)

    def recorded(self, task: str = TASK) -> dict[str, str]:
        """The effect records in the target database: key -> command tag."""
        if not self.value("SELECT to_regclass('effect_sidecar.effects') IS NOT NULL"):
            return {}  # never created, or created in a transaction that rolled back
        found = self.rows(
            "SELECT key, command_tag FROM effect_sidecar.effects WHERE task = %s", task
        )
        return {key: tag for key, tag in found}

    def effects(self, task: str = TASK) -> list[dict[str, Any]]:
        """The sidecar's effect log for ``task`` (as `sidecar effects` shows it)."""
        found: list[dict[str, Any]] = self.process.get(f"/v1/tasks/{task}/effects")["effects"]
        return found

    def settled_effects(self, task: str = TASK, timeout: float = 10.0) -> list[dict[str, Any]]:
        """The effect log once it has stopped changing and nothing is pending: what
        follows a statement is mirrored in the background, shortly after it."""
        deadline = time.monotonic() + timeout
        last: list[dict[str, Any]] | None = None
        while True:
            found = self.effects(task)
            quiet = found == last and all(e["state"] != "pending" for e in found)
            if quiet or time.monotonic() > deadline:
                return found
            last = found
            time.sleep(0.15)

    def close(self) -> None:
        for agent in self.agents:
            agent.end()
        self.process.terminate()
        self.database.drop()
