"""HttpRequestFacts: one request as rules see it."""

from __future__ import annotations

import dataclasses

from sidecar.rules.facts import HttpRequestFacts


def test_facts_with_a_body_equal_the_same_facts_built_with_it() -> None:
    headless = HttpRequestFacts.from_target(
        "post", "API.Example.COM", 443, "/v1/things?b=2&a=1", [("Content-Type", "json")]
    )
    body = b'{"name": "x"}'

    with_body = headless.with_body(body)

    assert with_body == dataclasses.replace(headless, body=body)
    assert with_body.json_body() == {"name": "x"}
    assert headless.body is None
    assert headless.json_body() is None


def test_a_body_parsed_before_is_not_carried_over_to_a_new_body() -> None:
    first = HttpRequestFacts.from_target("POST", "h", None, "/", body=b'{"n": 1}')
    assert first.json_body() == {"n": 1}

    assert first.with_body(b'{"n": 2}').json_body() == {"n": 2}
    assert first.with_body(b"not json").json_body() is None
