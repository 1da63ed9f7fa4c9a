"""``sidecar rules explain``: the winning rule, what it shadows, key, idempotency, probe."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sidecar.cli import main

REPO = Path(__file__).resolve().parents[3]
THINGS = REPO / "tests" / "acceptance" / "proxy" / "things.yaml"
PAYMENTS = REPO / "rules" / "idempotency-key.yaml"

SHADOWING = """\
rules:
  - name: things.any
    match: {host: api.things.test, method: POST, path: "/repos/{owner}/{repo}/things"}
    effect: non_idempotent
    key: "any:{body.name}"
"""


def explain(capsys, *argv: str) -> dict:
    assert main(["rules", "explain", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_matched_write_shows_rule_key_idempotency_and_probe(capsys):
    found = explain(
        capsys,
        "POST",
        "https://api.things.test/repos/acme/app/things",
        "--body",
        '{"name": "widget"}',
        "--rules",
        str(THINGS),
    )
    assert found["rule"]["name"] == "test.things.create"
    assert found["rule"]["at"] == f"{THINGS}:5"
    assert found["rule"]["params"] == {"owner": "acme", "repo": "app"}
    assert found["effect_key"] == "acme/app#thing:widget"
    assert found["idempotency"] is None
    assert found["probe"]["method"] == "GET"
    assert found["probe"]["host"] == "api.things.test"
    assert found["probe"]["path"] == "/repos/acme/app/things?name=widget"
    assert found["shadows"] == []


def test_the_idempotency_header_and_key_shape(capsys, tmp_path):
    body = tmp_path / "body.json"
    body.write_text('{"amount": 500}')
    found = explain(
        capsys,
        "POST",
        "https://api.example-payments.com/v1/charges",
        "--header",
        "X-Order-Id: 312",
        "--body",
        f"@{body}",
        "--rules",
        str(PAYMENTS),
    )
    assert found["effect_key"] == "312"
    assert found["idempotency"]["header"] == "Idempotency-Key"
    assert found["idempotency"]["value"].startswith("ATTEMPT_ID:")
    assert found["on_unknown"] == "retry"
    assert found["probe"] is None


def test_later_rules_that_would_match_too_are_shown_as_shadowed(capsys, tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(SHADOWING)
    url = "https://api.things.test/repos/acme/app/things"
    found = explain(capsys, "POST", url, "--rules", str(mine), "--rules", str(THINGS))
    assert found["rule"]["name"] == "things.any"
    assert found["shadows"] == [{"name": "test.things.create", "at": f"{THINGS}:5"}]


def test_an_unmatched_write_is_uncovered_with_its_shape(capsys):
    url = "https://api.things.test/repos/acme/app/issues/12/comments?page=1"
    found = explain(capsys, "POST", url, "--rules", str(THINGS))
    assert found["rule"] is None
    assert found["disposition"] == "uncovered"
    assert found["uncovered"]["shape"] == "/repos/acme/app/issues/{id}/comments"


def test_sql_shows_rule_key_and_ordinals(capsys):
    sql = (
        "CREATE TABLE t (a int); CREATE TABLE t (a int); "
        "/* sidecar:key=seed */ INSERT INTO x VALUES (1); SELECT 1"
    )
    found = explain(capsys, "--sql", sql, "--rules", str(REPO / "rules" / "postgres.yaml"))
    first, second, keyed, select = found["statements"]
    assert first["rule"]["name"] == "postgres.ddl"
    assert second["effect_key"] == first["effect_key"] + " #2"
    assert (first["ordinal"], second["ordinal"]) == (1, 2)
    assert keyed["effect_key"] == "seed"
    assert keyed["ordinal"] is None
    assert select["rule"] is None


def test_explain_as_a_real_process_prints_text(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sidecar",
            "rules",
            "explain",
            "POST",
            "https://api.things.test/repos/acme/app/things",
            "--body",
            '{"name": "widget"}',
            "--rules",
            str(THINGS),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"rule:        test.things.create ({THINGS}:5)" in done.stdout
    assert "effect key:  acme/app#thing:widget" in done.stdout
    assert "probe:       GET api.things.test/repos/acme/app/things?name=widget" in done.stdout


def test_check_as_a_real_process_fails_with_every_problem(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "rules:\n  - name: a\n    match: {host: x.com, paht: /x}\n    effect: read\n"
        "  - name: a\n    match: {host: x.com}\n    effect: bogus\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sidecar", "rules", "check", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert f"{bad}:3: rules[0].match: unknown field 'paht'" in lines
    assert any(line.startswith(f"{bad}:7: rules[1].effect: ") for line in lines)
    assert f"{bad}:5: duplicate rule name 'a' (first defined at {bad}:2)" in lines
    assert lines[-1] == "rules check: 3 problems"


def test_explain_needs_a_request_or_sql(capsys):
    import pytest  # noqa: PLC0415

    with pytest.raises(SystemExit) as exit_:
        main(["rules", "explain", "POST"])
    assert exit_.value.code == 2
