"""SQL password literals are cut out of what the relay writes down (SPEC §7), and only
those: every other statement is kept byte for byte."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sidecar.pgwire import redaction
from sidecar.pgwire.mirror import LogMirror
from sidecar.pgwire.redaction import normalised, redact
from sidecar.recording.bindings import Binding, Bindings
from sidecar.recording.recorder import Recorder
from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.model import Rule
from sidecar.rules.sql import Statement, matches, split
from sidecar.runtime.clock import SystemClock
from sidecar.runtime.metrics import Metrics

R = "'[redacted]'"

REDACTED = [
    ("CREATE ROLE app LOGIN PASSWORD 'hunter2'", f"CREATE ROLE app LOGIN PASSWORD {R}"),
    ("ALTER ROLE app WITH PASSWORD 'x'", f"ALTER ROLE app WITH PASSWORD {R}"),
    ("CREATE USER u PASSWORD 'p'", f"CREATE USER u PASSWORD {R}"),
    ("create user u password 'p' login", f"create user u password {R} login"),
    ("CREATE GROUP g WITH PASSWORD 'g1'", f"CREATE GROUP g WITH PASSWORD {R}"),
    (
        "ALTER USER bob ENCRYPTED PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVk:c2VydmVy'",
        f"ALTER USER bob ENCRYPTED PASSWORD {R}",
    ),
    ("ALTER ROLE app PASSWORD $$dollar$$", f"ALTER ROLE app PASSWORD {R}"),
    ("ALTER ROLE app PASSWORD $pw$it's $$ $pw$", f"ALTER ROLE app PASSWORD {R}"),
    ("ALTER ROLE app PASSWORD E'it\\'s\\n'", f"ALTER ROLE app PASSWORD {R}"),
    ("ALTER ROLE app PASSWORD 'it''s'", f"ALTER ROLE app PASSWORD {R}"),
    ("ALTER ROLE app PASSWORD U&'d\\0061t\\0061' LOGIN", f"ALTER ROLE app PASSWORD {R} LOGIN"),
    ("ALTER ROLE app PASSWORD U&'d!0061t' UESCAPE '!'", f"ALTER ROLE app PASSWORD {R}"),
    ("ALTER ROLE app PASSWORD 'hun'\n  'ter2' LOGIN", f"ALTER ROLE app PASSWORD {R} LOGIN"),
    ("ALTER ROLE app PASSWORD /* new */ 'x'", f"ALTER ROLE app PASSWORD /* new */ {R}"),
    (
        "CREATE ROLE app PASSWORD 'p' VALID UNTIL '2030-01-01' CONNECTION LIMIT 3",
        f"CREATE ROLE app PASSWORD {R} VALID UNTIL '2030-01-01' CONNECTION LIMIT 3",
    ),
    (
        "/* é */ CREATE ROLE \"rôle\" PASSWORD 'pässwörd' CREATEDB",
        f'/* é */ CREATE ROLE "rôle" PASSWORD {R} CREATEDB',
    ),
    (  # a multi-statement Query, if the split does not happen
        "CREATE ROLE a PASSWORD 'one'; SELECT 'password'; ALTER ROLE a PASSWORD 'two'",
        f"CREATE ROLE a PASSWORD {R}; SELECT 'password'; ALTER ROLE a PASSWORD {R}",
    ),
    (
        "CREATE USER MAPPING FOR bob SERVER remote OPTIONS (user 'bob', password 'fdw')",
        f"CREATE USER MAPPING FOR bob SERVER remote OPTIONS (user 'bob', password {R})",
    ),
    (
        "ALTER USER MAPPING FOR bob SERVER remote OPTIONS (SET password 'fdw2')",
        f"ALTER USER MAPPING FOR bob SERVER remote OPTIONS (SET password {R})",
    ),
    (
        "CREATE SUBSCRIPTION s CONNECTION 'host=h password=sub' PUBLICATION p",
        f"CREATE SUBSCRIPTION s CONNECTION {R} PUBLICATION p",
    ),
    (
        "ALTER SUBSCRIPTION s CONNECTION 'postgresql://rep:sub@h/db'",
        f"ALTER SUBSCRIPTION s CONNECTION {R}",
    ),
    # The parser refuses these (the server would too, but they are recorded first): the
    # scanner finds the literal after PASSWORD.
    ("ALTER ROLE app UNENCRYPTED PASSWORD 'old'", f"ALTER ROLE app UNENCRYPTED PASSWORD {R}"),
    ("CREATE ROLE app PASSWORD 'p' BOGUS", f"CREATE ROLE app PASSWORD {R} BOGUS"),
]

UNTOUCHED = [
    "ALTER ROLE app VALID UNTIL '2030-01-01'",
    "ALTER ROLE app PASSWORD NULL",
    "CREATE ROLE app LOGIN",
    "SET password_encryption = 'scram-sha-256'",
    "SELECT 'PASSWORD ''x''' AS text",
    "INSERT INTO users (name, password) VALUES ('bob', 'app data, not a role')",
    "COMMENT ON ROLE app IS 'rotates its password monthly'",
    "CREATE SUBSCRIPTION s CONNECTION 'host=h dbname=d' PUBLICATION p",
    "CREATE TABLE t (id int)  -- two  spaces, a comment: kept as sent",
]


@pytest.mark.parametrize(("sql", "expected"), REDACTED)
def test_password_literals_are_cut_out_and_nothing_else(sql: str, expected: str) -> None:
    assert redact(sql).text == expected


@pytest.mark.parametrize("sql", UNTOUCHED)
def test_statements_without_a_password_literal_are_kept_as_they_are(sql: str) -> None:
    assert redact(sql).text is sql


def test_an_unscannable_statement_is_cut_after_the_word_password() -> None:
    cut = redact("ALTER ROLE app PASSWORD 'unterminated")
    assert cut.text == "ALTER ROLE app PASSWORD [redacted]"
    assert cut.cut
    assert "unterminated" not in cut.scrub("rule:app:unterminated")


def test_each_statement_of_a_simple_query_is_redacted_on_its_own() -> None:
    sql = "SELECT 1; CREATE ROLE a LOGIN PASSWORD 'one';ALTER ROLE a PASSWORD $$two$$"
    assert [redact(s).text for s in split(sql)] == [
        "SELECT 1",
        f"CREATE ROLE a LOGIN PASSWORD {R}",
        f"ALTER ROLE a PASSWORD {R}",
    ]


def test_the_logged_normalised_text_is_redacted_before_it_is_normalised() -> None:
    """Normalising drops ``--`` to the end of the line, inside a literal too: done first,
    it would leave the password's beginning in the text."""
    statement = Statement.of("ALTER  ROLE app\n PASSWORD 'abc--def' /* x */ LOGIN")
    assert normalised(statement) == f"ALTER ROLE app PASSWORD {R} LOGIN"
    plain = Statement.of("CREATE TABLE t (id int)")
    assert normalised(plain) is plain.normalised


RULE = {
    "name": "app.roles",
    "match": {"sql": {"kind": ["ALTER"], "regex": r"^alter role (\w+) password (.+)$",
                      "key": "{group.1}:{group.2}"}},
    "effect": "non_idempotent",
}  # fmt: skip
DDL = {"name": "postgres.ddl", "match": {"sql": {"kind": ["ALTER"]}}, "effect": "non_idempotent"}


def _match(rule: dict[str, object], sql: str) -> tuple[SqlRuleMatch, Statement]:
    statement = Statement.of(sql)
    parsed = Rule.model_validate(rule)
    assert parsed.sql is not None
    return SqlRuleMatch(parsed, matches(parsed.sql.sql, statement)), statement


def _key(rule: dict[str, object], sql: str) -> tuple[str, str]:
    match, statement = _match(rule, sql)
    return match.key(statement), redaction.effect_key(match, statement)


def test_a_key_template_quoting_the_password_does_not_keep_it_in_clear() -> None:
    plain, key = _key(RULE, "ALTER ROLE app PASSWORD 'hunter2'")
    assert plain == "app.roles:app:'hunter2'"
    assert key.startswith("app.roles:app:[redacted:")
    assert "hunter2" not in key
    # Two passwords are still two effects, as they were.
    assert redaction.effect_key(*_match(RULE, "ALTER ROLE app PASSWORD 'other'")) != key
    # A statement with no password, and a key that quotes no text, are left alone.
    plain, key = _key(DDL, "ALTER ROLE app PASSWORD 'hunter2'")
    assert key == plain
    plain, key = _key(RULE, "ALTER ROLE app PASSWORD NULL")
    assert key == plain == "app.roles:app:NULL"


async def test_the_effect_log_keeps_the_statement_redacted(memory_store) -> None:  # type: ignore[no-untyped-def]
    claim = await memory_store.claim("312", "worker-a", 60)
    recorder = Recorder(memory_store, Bindings(memory_store, SystemClock()), Metrics())
    binding = Binding(
        "312", claim.attempt_id, claim.generation, "worker-a", datetime.now(UTC), 60, "pg"
    )
    match, statement = _match(DDL, "ALTER ROLE app WITH LOGIN PASSWORD 'hunter2'")
    await LogMirror(recorder, "shop_312").pending(binding, match, "sql:t", statement)
    effect = await memory_store.effect("312", "sql:t")
    assert effect.request["statement"] == f"ALTER ROLE app WITH LOGIN PASSWORD {R}"
