"""HttpRequestFacts: one request as rules see it."""

from __future__ import annotations

import dataclasses
from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

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


_TEXT = st.text(alphabet="aZ-_.%=&?[]:é\udcff ", max_size=12)


@given(
    method=st.sampled_from(["get", "POST", "Patch"]),
    host=_TEXT,
    port=st.none() | st.integers(1, 65535),
    target=_TEXT,
    headers=st.lists(st.tuples(_TEXT, _TEXT), max_size=4),
)
def test_facts_from_a_target_equal_the_normalising_constructor_s(
    method, host, port, target, headers
) -> None:
    # from_target builds its facts normalised itself, without the constructor.
    built = HttpRequestFacts.from_target(method, host, port, "/" + target, headers, b"{}")
    path, _, query = ("/" + target).partition("?")
    first: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        first.setdefault(name, value)
    firsts: dict[str, str] = {}
    for name, value in headers:
        firsts.setdefault(name.lower(), value)
    constructed = HttpRequestFacts(method, host, port, path, first, firsts, b"{}")
    assert built == constructed
    assert vars(built) == vars(constructed)
    assert built.json_body() == {}
