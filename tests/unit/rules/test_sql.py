"""SQL rules: which statements are effects, and the key that names each one."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from sidecar.rules import EffectKind, RuleError, load_rules
from sidecar.rules.sql import SqlCondition, Statement, split

PACKS = Path(__file__).resolve().parents[3] / "rules"
POSTGRES = load_rules([PACKS / "postgres.yaml"])


def rules_from(tmp_path: Path, text: str):
    path = tmp_path / "app.yaml"
    path.write_text(dedent(text))
    return load_rules([path])


def rule_for(sql: str) -> str | None:
    """The rule that makes ``sql`` an effect, or None when it passes through."""
    found = POSTGRES.match_sql(Statement.of(sql))
    return found.rule.name if found and found.rule.effect is EffectKind.NON_IDEMPOTENT else None


# ---- statements --------------------------------------------------------------------


def test_the_kind_is_the_leading_keyword_after_comments() -> None:
    statement = Statement.of("-- add a column\n/* why: reports */ alter table t add c int;")
    assert statement.kind == "ALTER"
    assert statement.normalised == "alter table t add c int"


def test_spacing_and_comments_do_not_change_the_digest_but_constants_do() -> None:
    one = Statement.of("INSERT INTO t VALUES (1)")
    assert Statement.of("INSERT  INTO t\n  VALUES (1); -- again").digest() == one.digest()
    assert Statement.of("INSERT INTO t VALUES (2)").digest() != one.digest()


def test_the_fingerprint_ignores_constants() -> None:
    assert (
        Statement.of("INSERT INTO t VALUES (1)").fingerprint()
        == Statement.of("INSERT INTO t VALUES (2)").fingerprint()
    )


def test_a_sidecar_key_comment_names_the_effect() -> None:
    assert Statement.of("/* sidecar:key=seed-2024 */ INSERT INTO t VALUES (1)").comment_key == (
        "seed-2024"
    )
    assert Statement.of("INSERT INTO t VALUES (1)").comment_key is None


@pytest.mark.parametrize(
    "sql",
    [
        "COPY things FROM STDIN",
        "copy things (id, name) from stdin with (format csv)",
        "COPY things FROM /* the agent's rows */ STDIN",
        "COPY things TO STDOUT",
        "COPY (DELETE FROM things RETURNING *) TO stdout WITH CSV HEADER",
        "/* sidecar:key=load */ COPY things FROM STDIN",
    ],
)
def test_a_copy_through_the_connection_is_told_from_its_text(sql: str) -> None:
    assert Statement.of(sql).copies_through_connection()


@pytest.mark.parametrize(
    "sql",
    [
        "COPY things FROM '/srv/things.csv'",
        "COPY things TO PROGRAM 'gzip > /srv/things.gz'",
        "SELECT 'copy things from stdin'",
        "INSERT INTO notes VALUES ('to stdout')",
    ],
)
def test_a_copy_on_the_server_or_another_statement_is_not(sql: str) -> None:
    assert not Statement.of(sql).copies_through_connection()


@pytest.mark.parametrize(
    ("sql", "from_agent"),
    [
        ("COPY things FROM STDIN", True),
        ("copy things (id, name) from stdin with (format csv)", True),
        ("/* sidecar:key=load */ COPY things FROM /* rows */ STDIN", True),
        ("COPY things TO STDOUT", False),
        ("COPY things FROM '/srv/things.csv'", False),
        ("INSERT INTO notes VALUES ('from stdin')", False),
    ],
)
def test_a_copy_whose_rows_come_from_the_agent_is_told_from_one_sending_them(
    sql: str, from_agent: bool
) -> None:
    assert Statement.of(sql).copies_from_agent() is from_agent


def test_split_keeps_each_statements_leading_comments() -> None:
    script = "-- 1\nCREATE TABLE a (i int);\n/* sidecar:key=k */ INSERT INTO a VALUES (';');"
    assert split(script) == [
        "-- 1\nCREATE TABLE a (i int)",
        "/* sidecar:key=k */ INSERT INTO a VALUES (';')",
    ]


def test_split_hands_back_unparsable_text_whole() -> None:
    assert split("CREATE TABLE (((; SELECT 1") == ["CREATE TABLE (((; SELECT 1"]


PLAIN = [
    "select 1",
    "  UPDATE pgbench_accounts SET abalance = abalance + -3811 WHERE aid = 53133;  ",
    "\n\tINSERT INTO \"T\" VALUES (1, 'it''s')\r\n;;",
    "ALTER TABLE orders ADD COLUMN status text ;",
    '\fselect "a""b" from t\v',
]


@pytest.mark.parametrize("sql", PLAIN)
def test_a_plain_statement_is_cut_as_the_parser_cuts_it(
    sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = split(sql)
    monkeypatch.setattr("sidecar.rules.sql._plain_single", lambda _: False)
    assert fast == split(sql)


@pytest.mark.parametrize("sql", PLAIN)
def test_a_statement_without_comments_is_read_as_one_with_them(sql: str) -> None:
    # The comment-free path gives what the general one gives to the same text.
    plain, commented = Statement.of(sql), Statement.of(sql + " /* */")
    assert (plain.kind, plain.normalised, plain.comment_key) == (
        commented.kind,
        commented.normalised,
        None,
    )


# ---- the postgres pack -------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "ALTER TABLE orders ADD COLUMN status text",
        "CREATE INDEX orders_by_status ON orders (status)",
        "create unique index concurrently x on t (c)",
        "DROP TABLE old_orders",
        "TRUNCATE audit",
        "GRANT SELECT ON orders TO reporting",
        "COMMENT ON TABLE orders IS 'orders'",
        "CREATE OR REPLACE FUNCTION f() RETURNS int AS 'select 1' LANGUAGE sql",
    ],
)
def test_schema_changes_are_effects(sql: str) -> None:
    assert rule_for(sql) == "postgres.ddl"


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TEMP TABLE scratch (i int)",
        "create temporary table scratch (i int)",
        "CREATE GLOBAL TEMPORARY TABLE scratch (i int)",
        "SELECT * FROM orders",
        "INSERT INTO orders (total) VALUES (1)",
        "UPDATE orders SET total = 2",
        "BEGIN",
        "SET search_path TO app",
    ],
)
def test_reads_session_state_and_ordinary_writes_are_not(sql: str) -> None:
    assert rule_for(sql) is None


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO alembic_version (version_num) VALUES ('0002')",
        "UPDATE alembic_version SET version_num='0003' WHERE alembic_version.version_num = '0002'",
        "INSERT INTO schema_migrations (version) VALUES ('20240101')",
        'INSERT INTO "flyway_schema_history" VALUES (1)',
        "DELETE FROM django_migrations WHERE app = 'x'",
    ],
)
def test_migration_tools_bookkeeping_is_an_effect(sql: str) -> None:
    assert rule_for(sql) == "postgres.migrations.bookkeeping"


def test_a_keyed_comment_makes_any_statement_an_effect_named_by_it() -> None:
    statement = Statement.of("/* sidecar:key=seed */ INSERT INTO statuses VALUES ('new')")
    found = POSTGRES.match_sql(statement)
    assert found is not None
    assert found.rule.name == "postgres.keyed"
    assert found.key(statement) == "seed"


def test_the_default_key_is_the_statement_plus_its_parameters() -> None:
    statement = Statement.of("UPDATE alembic_version SET version_num = $1")
    found = POSTGRES.match_sql(statement)
    assert found is not None
    plain = found.key(statement)
    assert plain == f"sql:{statement.digest()}"
    assert found.key(statement, (b"0002",)) != found.key(statement, (b"0003",))
    assert found.key(statement, (b"0002",)).startswith(plain + ":")


# ---- rules of one's own ------------------------------------------------------------


def test_key_templates_take_regex_groups_parameters_and_builtins(tmp_path: Path) -> None:
    rules = rules_from(
        tmp_path,
        """\
        version: 1
        rules:
          - name: app.invoice
            match:
              sql:
                kind: INSERT
                regex: "into invoices_(?P<year>\\\\d{4})"
                key: "{group.year}/{param.1}/{kind}"
            effect: non_idempotent
        """,
    )
    statement = Statement.of("INSERT INTO invoices_2026 (n) VALUES ($1)")
    found = rules.match_sql(statement)
    assert found is not None
    assert found.rule.effect is EffectKind.NON_IDEMPOTENT
    assert found.key(statement, (b"INV-7",)) == "app.invoice:2026/INV-7/INSERT"
    assert found.key(statement, (None,)) == "app.invoice:2026/NULL/INSERT"


def test_regexes_ignore_case_as_sql_does(tmp_path: Path) -> None:
    rules = rules_from(
        tmp_path,
        """\
        version: 1
        rules:
          - name: app.ledger
            match: {sql: {regex: "insert into ledger"}}
            effect: non_idempotent
        """,
    )
    assert rules.match_sql(Statement.of("INSERT INTO Ledger VALUES (1)")) is not None


def test_every_condition_given_must_hold(tmp_path: Path) -> None:
    rules = rules_from(
        tmp_path,
        """\
        version: 1
        rules:
          - name: app.big_deletes
            match: {sql: {kind: DELETE, regex: "from ledger"}}
            effect: non_idempotent
        """,
    )
    assert rules.match_sql(Statement.of("DELETE FROM ledger WHERE id = 1")) is not None
    assert rules.match_sql(Statement.of("DELETE FROM carts")) is None
    assert rules.match_sql(Statement.of("SELECT * FROM ledger")) is None


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ("{kind: 'ALTER TABLE'}", "kind is a keyword"),
        ("{regex: '(unclosed'}", "invalid regular expression"),
        ("{kind: INSERT, key: '{header.X}'}", "not a SQL key placeholder"),
        ("{}", "say what statements to match"),
    ],
)
def test_a_bad_sql_rule_is_reported_at_its_file_and_line(
    tmp_path: Path, condition: str, says: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: 1\nrules:\n  - name: app.bad\n"
        f"    match: {{sql: {condition}}}\n    effect: non_idempotent\n"
    )
    with pytest.raises(RuleError) as error:
        load_rules([path])
    text = str(error.value)
    assert says in text
    assert f"{path}:3" in text or f"{path}:4" in text


def test_a_condition_is_a_model_with_no_stray_fields() -> None:
    with pytest.raises(ValueError, match="extra"):
        SqlCondition.model_validate({"kind": "INSERT", "tables": ["x"]})
