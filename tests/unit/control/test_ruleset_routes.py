"""GET /v1/rules and POST /v1/rules/explain: the loaded rules, and what a request would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.rules.loader import load_rules
from tests.unit.control.test_tasks_routes import problem_of

RULES = """\
version: 1
rules:
  - name: things.create
    match: {host: api.things.test, method: POST, path: "/repos/{owner}/{repo}/things"}
    effect: non_idempotent
    key: "{owner}/{repo}#thing:{body.name}"
    on_unknown: probe
    probe:
      request: {method: GET, path: "/repos/{owner}/{repo}/things?name={body.name}"}
      found: "length(@) > `0`"
      answer: {status: 201, body: "[0]"}
  - name: things.blocked
    match: {host: blocked.things.test, method: POST}
    effect: non_idempotent
    key: "blocked#{body.name}"
    idempotency_header: Idempotency-Key
  - name: sql.ddl
    match: {sql: {kind: [ALTER, CREATE]}}
    effect: non_idempotent
"""


@pytest.fixture
async def ruled(make_client, tmp_path: Path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return await make_client(rules=load_rules([path]))


async def test_the_rules_are_listed_in_matching_order_with_where_they_are_written(ruled):
    listed = await (await ruled.get("/v1/rules")).json()
    assert [r["name"] for r in listed["rules"]] == ["things.create", "things.blocked", "sql.ddl"]
    first = listed["rules"][0]
    assert first["at"].endswith("rules.yaml:3")
    assert first["effect"] == "non_idempotent"
    assert first["probe"] is True
    assert first["definition"]["key"] == "{owner}/{repo}#thing:{body.name}"
    assert listed["rules"][1]["on_unknown"] == "block"


async def test_without_rules_the_list_is_empty(client):
    assert (await (await client.get("/v1/rules")).json())["rules"] == []


async def test_a_request_is_explained_with_its_key_and_the_probe_it_would_send(ruled):
    response = await ruled.post(
        "/v1/rules/explain",
        json={
            "method": "POST",
            "url": "https://api.things.test/repos/acme/app/things",
            "body": {"name": "gear"},
        },
    )
    assert response.status == 200, await response.text()
    found = (await response.json())["http"]
    assert found["rule"]["name"] == "things.create"
    assert found["disposition"] == "guarded"
    assert found["effect_key"] == "acme/app#thing:gear"
    assert found["probe"]["path"] == "/repos/acme/app/things?name=gear"


async def test_a_blocked_rule_has_no_probe_and_names_its_idempotency_header(ruled):
    response = await ruled.post(
        "/v1/rules/explain",
        json={"method": "post", "url": "https://blocked.things.test/x", "body": {"name": "n"}},
    )
    found = (await response.json())["http"]
    assert found["effect_key"] == "blocked#n"
    assert found["probe"] is None
    assert found["idempotency"]["header"] == "Idempotency-Key"


async def test_a_write_no_rule_covers_is_uncovered(ruled):
    response = await ruled.post(
        "/v1/rules/explain", json={"method": "PUT", "url": "https://elsewhere.test/a/1"}
    )
    found = (await response.json())["http"]
    assert found["disposition"] == "uncovered"
    assert found["uncovered"]["suggested_match"]["host"] == "elsewhere.test"


async def test_sql_is_explained_statement_by_statement(ruled):
    response = await ruled.post(
        "/v1/rules/explain",
        json={"sql": "ALTER TABLE t ADD c int; SELECT 1; ALTER TABLE t ADD c int"},
    )
    statements = (await response.json())["sql"]["statements"]
    assert [s["disposition"] for s in statements] == ["guarded", "passthrough", "guarded"]
    assert statements[2]["effect_key"].endswith("#2")


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"method": "POST"},
        {"method": "POST", "url": "https://a.test/", "sql": "SELECT 1"},
        {"method": "POST", "url": "not a url"},
        {"method": "POST", "url": "https://a.test/", "extra": 1},
    ],
)
async def test_a_malformed_explain_request_is_a_problem(ruled, body):
    await problem_of(await ruled.post("/v1/rules/explain", json=body), 422, "invalid_request")
