"""Path shapes (the uncovered-writes inventory) and the rule warnings of ``rules check``."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.rules import Rule, RuleSet, RuleSource
from sidecar.rules.lint import rule_warnings
from sidecar.rules.shapes import as_template, request_shape


@pytest.mark.parametrize(
    ("target", "shape"),
    [
        ("/repos/acme/app/issues/1234/comments?page=2", "/repos/acme/app/issues/{id}/comments"),
        ("/v1/charges/ch_3N4aBcD5eF6gH7iJ8kL", "/v1/charges/{id}"),
        ("/git/commits/0123abcd9f?x=1", "/git/commits/{id}"),
        ("/x/550e8400-e29b-41d4-a716-446655440000/y/12", "/x/{id}/y/{id}"),
        ("/01HZX3J5Q8M6V4T2R0P9N7K5B3/items", "/{id}/items"),  # a ULID
        ("/v1/users", "/v1/users"),  # v1 is a word, not an id
        ("/deadbeef/cafe", "/deadbeef/cafe"),  # hex-looking words without a digit stay
        ("/", "/"),
        ("", "/"),
    ],
)
def test_ids_hex_uuids_and_numbers_collapse_and_the_query_goes(target, shape):
    assert request_shape(target) == shape


def test_a_very_deep_path_is_cut_short():
    shape = request_shape("/a" * 100)
    assert shape.endswith("/...")
    assert shape.count("/") == 33


def test_a_shape_as_a_match_template_names_each_id_apart():
    assert as_template("/x/{id}/y/{id}") == "/x/{id}/y/{id2}"


def rule(name: str, **match: object) -> Rule:
    return Rule.model_validate(
        {"name": name, "match": match, "effect": "non_idempotent", "key": "{method}"}
    )


def warnings_of(*rules: Rule) -> list[str]:
    sources = {r.name: RuleSource(Path("r.yaml"), n + 1) for n, r in enumerate(rules)}
    return [f"{at.line}: {text}" for at, text in rule_warnings(RuleSet(rules, sources))]


def test_the_same_host_method_and_path_template_shadows():
    found = warnings_of(
        rule("a", host="x.com", method="POST", path="/r/{owner}/things"),
        rule("b", host="X.com", method="POST", path="/r/{name}/things/"),
    )
    assert found == [
        "2: rule b can never match: rule a (r.yaml:1) comes first and matches every request "
        "it would"
    ]


def test_a_catch_all_on_the_same_host_and_method_shadows_and_so_does_a_star_host():
    assert (
        len(
            warnings_of(
                rule("a", host="x.com", method="POST"),
                rule("b", host="x.com", method="POST", path="/p"),
            )
        )
        == 1
    )
    assert len(warnings_of(rule("a", host="*"), rule("b", host="x.com", method="PUT"))) == 1


@pytest.mark.parametrize(
    ("first", "later"),
    [
        (
            {"host": "x.com", "method": "POST", "path": "/a"},
            {"host": "x.com", "method": "POST", "path": "/b"},
        ),
        ({"host": "x.com", "method": "POST"}, {"host": "x.com", "path": "/b"}),  # any method
        ({"host": "x.com"}, {"host": ["x.com", "y.com"]}),  # a host the first lacks
        ({"host": "*.x.com"}, {"host": "a.x.com"}),  # globs are not compared: conservative
        ({"host": "x.com", "query": {"a": "1"}}, {"host": "x.com"}),  # a condition more
        ({"host": "x.com", "path": "/a/{id}"}, {"host": "x.com"}),  # a path vs any path
        ({"host": "x.com", "path": "/a/{id*}"}, {"host": "x.com", "path": "/a/{id}"}),
    ],
)
def test_no_warning_unless_the_earlier_rule_surely_matches_everything(first, later):
    assert warnings_of(rule("a", **first), rule("b", **later)) == []


def test_a_keyless_non_idempotent_http_rule_is_warned_of():
    keyless = Rule.model_validate(
        {"name": "k", "match": {"host": "x.com", "method": "POST"}, "effect": "non_idempotent"}
    )
    idempotent = Rule.model_validate(
        {"name": "i", "match": {"host": "y.com", "method": "PUT"}, "effect": "idempotent"}
    )
    sql = Rule.model_validate(
        {"name": "s", "match": {"sql": {"kind": "CREATE"}}, "effect": "non_idempotent"}
    )
    found = warnings_of(keyless, idempotent, sql)
    assert len(found) == 1
    assert found[0].startswith("1: rule k is non_idempotent without a 'key'")


def test_a_method_no_standard_names_is_warned_of_with_the_nearest_but_webdavs_are_not():
    found = warnings_of(
        rule("typo", host="x.com", method="PSOT"),
        rule("webdav", host="y.com", method=["PROPFIND", "MKCOL"]),
        rule("odd", host="z.com", method="FROBNICATE"),
    )
    assert found == [
        "1: rule typo matches method PSOT, which is no standard HTTP method; did you mean POST?",
        "3: rule odd matches method FROBNICATE, which is no standard HTTP method",
    ]


def test_a_sql_rule_after_a_broader_one_is_shadowed_but_not_after_a_regex():
    ddl = {"name": "ddl", "match": {"sql": {"kind": ["CREATE", "ALTER"]}}, "effect": "read"}
    create = {"name": "create", "match": {"sql": {"kind": "CREATE"}}, "effect": "read"}
    regex = {"name": "re", "match": {"sql": {"regex": "CREATE"}}, "effect": "read"}
    as_rules = [Rule.model_validate(r) for r in (ddl, create)]
    assert len(warnings_of(*as_rules)) == 1
    assert warnings_of(Rule.model_validate(regex), Rule.model_validate(create)) == []
