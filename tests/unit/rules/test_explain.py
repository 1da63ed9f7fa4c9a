"""What ``explain`` says the sidecar would do with one request or SQL text, from the rules
alone: the winner and what it shadows, the key and its source, idempotency, the probe."""

from __future__ import annotations

from pathlib import Path

from sidecar.rules import HttpRequestFacts, Rule, RuleSet, RuleSource, fingerprint
from sidecar.rules.explain import ATTEMPT, explain_http, explain_sql

HOST = "api.example.com"


def rule(name: str, **fields) -> Rule:
    match = fields.pop("match", {"host": HOST, "method": "POST", "path": "/v1/{kind}"})
    return Rule.model_validate({"name": name, "effect": "non_idempotent", "match": match} | fields)


def post(path: str = "/v1/charges", body: bytes | None = b'{"id": "c1"}', method="POST"):
    return HttpRequestFacts.from_url(method, f"https://{HOST}{path}", [], body)


def test_the_first_rule_wins_and_the_later_matching_ones_are_shadowed():
    rules = RuleSet(
        [rule("first", key="{kind}:{body.id}"), rule("second"), rule("other", match={"host": "x"})],
        sources={"first": RuleSource(Path("a.yaml"), 3), "second": RuleSource(Path("b.yaml"), 9)},
    )
    found = explain_http(rules, post())
    assert found["request"] == {"method": "POST", "host": HOST, "path": "/v1/charges"}
    assert found["intercepted"] is True
    assert found["rule"] == {
        "name": "first",
        "at": "a.yaml:3",
        "effect": "non_idempotent",
        "params": {"kind": "charges"},
    }
    assert found["shadows"] == [{"name": "second", "at": "b.yaml:9"}]
    assert found["disposition"] == "guarded"
    assert found["effect_key"] == "charges:c1"
    assert found["key_from"] == "'key' '{kind}:{body.id}'"
    assert found["fingerprint"] == fingerprint(post())
    assert found["idempotency"] is None
    assert found["probe"] is None


def test_a_key_that_cannot_be_rendered_falls_back_and_says_so():
    found = explain_http(RuleSet([rule("r", key="{body.missing}")]), post())
    assert "cannot be rendered" in found["key_from"]
    assert found["effect_key"].startswith("r:POST /v1/charges#")
    keyless = explain_http(RuleSet([rule("r")]), post())
    assert keyless["key_from"].startswith("no 'key'")


def test_the_idempotency_key_is_shown_for_a_placeholder_attempt():
    found = explain_http(
        RuleSet([rule("r", key="k", idempotency_header="Idempotency-Key")]), post()
    )
    assert found["idempotency"]["header"] == "Idempotency-Key"
    assert found["idempotency"]["value"].startswith(f"{ATTEMPT}:")


def test_the_probe_is_rendered_for_the_request_or_says_why_not():
    probe = {
        "request": {"method": "GET", "path": "/v1/{kind}?id={body.id}"},
        "found": "length(@) > `0`",
        "answer": {"status": 201, "body": "[0]"},
    }
    rules = RuleSet([rule("r", key="k", on_unknown="probe", probe=probe)])
    found = explain_http(rules, post())["probe"]
    assert (found["method"], found["host"], found["path"]) == ("GET", HOST, "/v1/charges?id=c1")
    assert found["answer_status"] == 201
    assert "cannot build the probe" in explain_http(rules, post(body=b"{}"))["probe"]["error"]


def test_a_rule_that_is_not_logged_passes_through():
    found = explain_http(RuleSet([rule("reads", effect="read")]), post())
    assert found["disposition"] == "passthrough"
    assert "effect_key" not in found


def test_an_unmatched_write_is_uncovered_and_an_unmatched_read_passes():
    rules = RuleSet([rule("r", match={"host": HOST, "method": "POST", "path": "/v1/x"})])
    found = explain_http(rules, post("/v1/items/123/notes"))
    assert (found["rule"], found["disposition"]) == (None, "uncovered")
    assert found["uncovered"]["shape"] == "/v1/items/{id}/notes"
    assert found["uncovered"]["suggested_match"]["method"] == "POST"
    read = explain_http(rules, post("/v1/items", None, method="GET"))
    assert (read["rule"], read["disposition"]) == (None, "passthrough")
    assert "uncovered" not in read


def test_sql_statements_get_ordinals_unless_named_by_a_comment():
    ddl = rule("ddl", match={"sql": {"kind": ["CREATE", "INSERT"]}})
    found = explain_sql(
        RuleSet([ddl]),
        "CREATE TABLE t (a int); CREATE TABLE t (a int); "
        "/* sidecar:key=seed */ INSERT INTO x VALUES (1); SELECT 1",
    )
    first, second, named, select = found["statements"]
    assert first["disposition"] == "guarded"
    assert (first["ordinal"], second["ordinal"]) == (1, 2)
    assert second["effect_key"] == f"{first['effect_key']} #2"
    assert (named["effect_key"], named["ordinal"]) == ("seed", None)
    assert (select["rule"], select["disposition"]) == (None, "passthrough")
