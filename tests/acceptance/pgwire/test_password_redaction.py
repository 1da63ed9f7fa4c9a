"""SQL password literals through the relay: run as sent, never kept in clear (SPEC §7).

Roles are created and altered with passwords by psycopg (simple protocol, one and several
statements per Query) and asyncpg (extended protocol), as recorded effects of one task.
PostgreSQL gets each statement untouched - the roles end with exactly those passwords -
while the sidecar's store (database, WAL), its debug-level log and the record it keeps in
the agent's database (``effect_sidecar.effects``) hold ``'[redacted]'`` instead.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import uuid
from pathlib import Path

import asyncpg
import psycopg
import pytest

from sidecar.rules.packs import packs_dir
from tests.acceptance.pgwire.conftest import MakeWorld
from tests.support.postgres import Attempt, PostgresWorld

pytestmark = pytest.mark.acceptance

# A key template quoting the statement's text, ahead of the pack's postgres.ddl.
ROLE_RULES = """\
version: 1
rules:
  - name: app.role_passwords
    match:
      sql:
        kind: ALTER
        regex: "^alter role (\\\\w+) with password (.+)$"
        key: "{group.1}/{group.2}"
    effect: non_idempotent
"""


def scram_matches(verifier: str, password: str) -> bool:
    """Whether a SCRAM-SHA-256 verifier (pg_authid.rolpassword) is ``password``'s."""
    method, rest = verifier.split("$", 1)
    assert method == "SCRAM-SHA-256", verifier
    params, keys = rest.split("$")
    iterations, salt = params.split(":")
    stored_key = keys.split(":")[0]
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations)
    )
    client_key = hmac.new(salted, b"Client Key", "sha256").digest()
    return hashlib.sha256(client_key).digest() == base64.b64decode(stored_key)


def password_is(world: PostgresWorld, role: str, password: str) -> bool:
    stored = world.value("SELECT rolpassword FROM pg_authid WHERE rolname = %s", role)
    assert stored is not None, f"{role} has no password"
    if stored.startswith("md5"):
        return bool(stored == "md5" + hashlib.md5((password + role).encode()).hexdigest())
    return scram_matches(stored, password)


def connect(world: PostgresWorld, attempt: Attempt, **kw: object) -> psycopg.Connection:
    return psycopg.connect(world.client_url(), autocommit=True, options=attempt.pgoptions, **kw)  # type: ignore[arg-type]


def test_passwords_are_set_as_sent_and_kept_nowhere_in_clear(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    rules = tmp_path / "role-rules.yaml"
    rules.write_text(ROLE_RULES)
    world = make_world(
        rules=[rules, packs_dir() / "postgres.yaml"], sidecar_args=["--log-level", "debug"]
    )
    secret = uuid.uuid4().hex  # in every password: nowhere else
    one, two, three = (f"es_redact_{secret[:8]}_{n}" for n in range(3))
    final = {one: f"{secret}-dollar", two: f"{secret}-multi", three: f"{secret}-extended"}
    task = f"redact-{secret[:8]}"
    try:
        attempt = world.claim(task)
        with connect(world, attempt) as db:  # simple protocol
            assert db.execute(
                f"CREATE ROLE {one} LOGIN PASSWORD '{secret}-simple'"
            ).statusmessage == ("CREATE ROLE")
            # Recorded under app.role_passwords, whose key quotes the password.
            db.execute(f"ALTER ROLE {one} WITH PASSWORD $pw${secret}-dollar$pw$")
        with connect(world, attempt, cursor_factory=psycopg.ClientCursor) as db:
            cursor = db.execute(  # several statements in one Query
                f"CREATE USER {two} PASSWORD E'{secret}-e\\'s'; "
                f"ALTER USER {two} ENCRYPTED PASSWORD '{secret}-multi' VALID UNTIL 'infinity'"
            )
            assert cursor.statusmessage == "CREATE ROLE"
            assert cursor.nextset()
            assert cursor.statusmessage == "ALTER ROLE"

        async def extended() -> None:
            settings = {"sidecar.task": attempt.task, "sidecar.attempt": attempt.attempt_id}
            db = await asyncpg.connect(world.client_url(), ssl=False, server_settings=settings)
            try:  # Parse/Bind/Execute, prepared by asyncpg
                await (await db.prepare(f"CREATE ROLE {three} PASSWORD '{secret}-first'")).fetch()
                await db.fetch(f"ALTER ROLE {three} WITH PASSWORD '{secret}-extended'")
            finally:
                await db.close()

        asyncio.run(extended())

        # The next attempt, from the top: the key quoting the password still names the
        # same effect, which is replayed (the password set later stays).
        with connect(world, world.claim(task)) as db:
            db.execute(f"CREATE ROLE {one} LOGIN PASSWORD '{secret}-simple'")
            db.execute(f"ALTER ROLE {one} WITH PASSWORD $pw${secret}-dollar$pw$")

        # PostgreSQL got the statements as sent.
        for role, password in final.items():
            assert password_is(world, role, password), role

        effects = world.settled_effects(task)
        assert len(effects) == 6, effects
        assert all(e["state"] == "completed" for e in effects), effects
        statements = sorted(e["request"]["statement"] for e in effects)
        assert all("PASSWORD '[redacted]'" in s for s in statements), statements
        assert f"ALTER USER {two} ENCRYPTED PASSWORD '[redacted]' VALID UNTIL 'infinity'" in (
            statements
        )
        by_rule = [e for e in effects if e["rule"] == "app.role_passwords"]
        assert sorted(e["key"].split("[")[0] for e in by_rule) == [
            f"app.role_passwords:{role}/" for role in (one, three)
        ]
        replayed = [e for e in effects if [x["event"] for x in e["events"]][-1] == "replayed"]
        assert len(replayed) == 2, effects  # role one's two statements, the next attempt

        recorded = world.rows("SELECT key, statement FROM effect_sidecar.effects")
        assert len(recorded) == 6, recorded
        assert all("PASSWORD '[redacted]'" in statement for _, statement in recorded), recorded
        assert secret not in repr(recorded)
        assert secret not in repr(effects)

        # Nothing the sidecar wrote holds it: its store, WAL and all, and its log (debug).
        files = [p for p in (world.root / "sidecar").rglob("*") if p.is_file()]
        assert any(p.name.endswith("-wal") for p in files), files
        logs = sorted(world.root.glob("sidecar-*.log"))
        assert '"level":"debug"' in logs[0].read_text()
        for path in files + logs:
            assert secret.encode() not in path.read_bytes(), path
        assert world.sidecar is not None
        assert secret not in "\n".join(world.sidecar.lines)
    finally:
        for role in (one, two, three):
            world.rows(f"DROP ROLE IF EXISTS {role}")
