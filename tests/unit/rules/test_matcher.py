"""Matching requests to rules (first match wins, headers only), effect keys and fingerprints."""

from __future__ import annotations

import hashlib
import json
from urllib.parse import urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.rules import (
    HttpRequestFacts,
    Rule,
    RuleSet,
    canonical_body,
    fingerprint,
    matcher,
    same_payload,
)
from sidecar.rules.facts import rule_host


def make(name, effect="non_idempotent", **match):
    fields = {"name": name, "effect": effect, "match": {"host": "api.example.com"} | match}
    return Rule.model_validate(fields)


def facts(method="POST", url="https://api.example.com/v1/charges", headers=(), body=None):
    return HttpRequestFacts.from_url(method, url, headers, body)


def test_facts_are_normalised_whoever_builds_them():
    built = HttpRequestFacts("post", "API.Example.COM", 443, "/x", {}, {"X-A": "1"})
    assert (built.method, built.host, built.headers) == ("POST", "api.example.com", {"x-a": "1"})
    parsed = facts(
        url="https://[::1]:8443/p/a%20b?q=1&q=2&e=", headers=[("X-A", "1"), ("x-a", "2")]
    )
    assert (parsed.host, parsed.port, parsed.path) == ("::1", 8443, "/p/a%20b")
    assert parsed.query == {"q": "1", "e": ""}
    assert parsed.headers == {"x-a": "1"}


def test_the_json_body_is_parsed_once_and_none_when_not_json():
    assert facts(body=b'{"a": 1}').json_body() == {"a": 1}
    assert facts(body=b"amount=1").json_body() is None
    assert facts(body=b"\xff\xfe").json_body() is None
    assert facts().json_body() is None


def test_the_first_matching_rule_in_load_order_wins():
    rules = RuleSet(
        [make("charge", method="POST", path="/v1/charges"), make("any-post", method="POST")]
    )
    assert rules.match(facts()).rule.name == "charge"
    assert rules.match(facts(url="https://api.example.com/v1/refunds")).rule.name == "any-post"
    assert rules.match(facts(method="GET")) is None


def test_a_match_carries_the_path_parameters():
    rules = RuleSet([make("pulls", path="/repos/{owner}/{repo}/pulls")])
    found = rules.match(facts(url="https://api.example.com/repos/octo/hello/pulls/"))
    assert found is not None
    assert found.params == {"owner": "octo", "repo": "hello"}


def test_every_condition_must_hold():
    rule = make(
        "refund",
        method=["POST", "PUT"],
        path="/v1/refunds",
        query={"mode": "live", "trace": "*"},
        headers={"X-Kind": "refund"},
    )
    rules = RuleSet([rule])
    url = "https://API.example.com/v1/refunds?mode=live&trace=1"
    assert rules.match(facts(url=url, headers={"x-kind": "refund"})) is not None
    assert rules.match(facts(method="PUT", url=url, headers={"X-KIND": "refund"})) is not None
    for method, target, headers in [
        ("GET", url, {"X-Kind": "refund"}),
        ("POST", "https://other.com/v1/refunds?mode=live&trace=1", {"X-Kind": "refund"}),
        ("POST", "https://api.example.com/v1/refunds?mode=test&trace=1", {"X-Kind": "refund"}),
        ("POST", "https://api.example.com/v1/refunds?mode=live", {"X-Kind": "refund"}),
        ("POST", url, {"X-Kind": "charge"}),
        ("POST", url, {}),
    ]:
        assert rules.match(facts(method, target, headers)) is None, (method, target, headers)


def test_matching_never_needs_the_body():
    rules = RuleSet([make("charge", path="/v1/charges")])
    assert rules.match(facts(body=None)) == rules.match(facts(body=b'{"a": 1}'))


def test_a_host_with_a_port_matches_only_that_port():
    rules = RuleSet([make("local", host="api.example.com:8443")])
    assert rules.match(facts(url="https://api.example.com:8443/x")) is not None
    assert rules.match(facts(url="https://api.example.com/x")) is not None  # port not known
    assert rules.match(HttpRequestFacts("POST", "api.example.com", 443, "/x")) is None


def test_may_match_host_tells_which_connections_to_open():
    rules = RuleSet([make("a", host="*.example.com"), make("b", host=["x.org:8443"])])
    assert rules.may_match_host("API.example.com", 443)
    assert rules.may_match_host("x.org")
    assert rules.may_match_host("x.org", 8443)
    assert not rules.may_match_host("x.org", 443)
    assert not rules.may_match_host("example.com")
    assert not RuleSet().may_match_host("example.com")


@given(
    st.sampled_from(["api.example.com", "x.org", "::1", "example.com"]),
    st.randoms(),
    st.booleans(),
    st.sampled_from([None, 443, 8443]),
)
def test_a_host_is_intercepted_whenever_a_request_to_it_could_match(name, rnd, bracketed, port):
    """The TLS decision and the match see a host alike, however it is spelled."""
    rules = RuleSet(
        [make("a", host="*.example.com"), make("b", host=["x.org:8443"]), make("c", host="[::1]")]
    )
    spelled = "".join(c.upper() if rnd.random() < 0.5 else c for c in name)
    host = f"[{spelled}]" if bracketed else spelled
    matched = rules.match(HttpRequestFacts("POST", host, port, "/v1/charges")) is not None
    assert rules.may_match_host(host, port) == matched
    assert rule_host(host) == name


def test_may_match_host_answers_the_same_when_asked_again_and_past_its_memory(monkeypatch):
    monkeypatch.setattr(matcher, "HOSTS_KEPT", 3)
    rules = RuleSet([make("a", host="*.example.com"), make("b", host=["x.org:8443"])])
    asked = [("API.example.com", 443), ("x.org", 443), ("[x.org]", 8443), ("other.net", None)]
    first = [rules.may_match_host(host, port) for host, port in asked]
    again = [rules.may_match_host(host, port) for host, port in asked * 3]
    assert first == [True, False, True, False]
    assert again == first * 3
    long = "a" * 300 + ".example.com"
    assert rules.may_match_host(long, 443)
    assert (long, 443) not in rules._hosts


RULES_ON_SEVERAL_HOSTS = [
    make("a", host="*.example.com", method="POST", path="/v1/{thing}"),
    make("b", host=["x.org:8443", "api.example.com"], method=["PUT", "POST"], path="/{rest*}"),
    make("c", host="x.org", path="/v1/charges", headers={"x-env": "live"}),
    make("d", host="*", method="DELETE"),
]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "X" * 40]),
            st.sampled_from(["api.example.com", "X.org", "other.net", "[::1]"]),
            st.sampled_from([None, 443, 8443]),
            st.sampled_from(["/v1/charges", "/v1/x/y", "//v1/charges", "/"]),
            st.sampled_from([{}, {"X-Env": "live"}]),
        ),
        max_size=30,
    )
)
def test_a_request_gets_the_first_rule_that_matches_whatever_was_asked_before(requests):
    matcher.HOSTS_KEPT, kept = 2, matcher.HOSTS_KEPT  # a small memory, emptied often
    try:
        rules = RuleSet(RULES_ON_SEVERAL_HOSTS)
        for method, host, port, path, headers in requests:
            asked = HttpRequestFacts.from_target(method, host, port, path, headers)
            expected = next(
                (
                    (rule.name, params)
                    for rule in RULES_ON_SEVERAL_HOSTS
                    if rule.http and (params := matcher.http_match(rule.http, asked)) is not None
                ),
                None,
            )
            found = rules.match(asked)
            assert (None if found is None else (found.rule.name, dict(found.params))) == expected
            assert len(rules._by_method) <= 2
        assert all(len(method) <= matcher.METHOD_KEPT_LENGTH for _, _, method in rules._by_method)
    finally:
        matcher.HOSTS_KEPT = kept


def test_the_effect_key_renders_the_rules_key_template():
    rules = RuleSet(
        [
            Rule.model_validate(
                {
                    "name": "pulls",
                    "match": {"host": "api.example.com", "path": "/repos/{owner}/{repo}/pulls"},
                    "effect": "non_idempotent",
                    "key": "{owner}/{repo}#pull:{body.head}->{body.base}",
                }
            )
        ]
    )
    request = facts(
        url="https://api.example.com/repos/octo/hello/pulls",
        body=b'{"head": "agent/312", "base": "main"}',
    )
    found = rules.match(request)
    assert found.key(request) == "octo/hello#pull:agent/312->main"


def key_of(rules: RuleSet, request: HttpRequestFacts) -> str:
    found = rules.match(request)
    assert found is not None
    return found.key(request)


def test_without_a_key_the_effect_key_is_the_request_with_a_body_hash():
    rules = RuleSet([make("charge")])
    one = facts(body=b'{"amount": 1, "currency": "usd"}')
    same = facts(body=b'{ "currency":"usd",\n "amount":1 }')
    other = facts(body=b'{"amount": 2, "currency": "usd"}')
    key = key_of(rules, one)
    assert key.startswith("charge:POST /v1/charges#")
    assert len(key.rpartition("#")[2]) == 16
    assert key_of(rules, same) == key  # JSON key order and spaces
    assert key_of(rules, other) != key


def test_the_fallback_key_hashes_raw_bytes_and_the_query_too():
    rules = RuleSet([make("form")])
    form = facts(body=b"amount=1&currency=usd")
    assert key_of(rules, form) == key_of(rules, form)
    a = facts(url="https://api.example.com/v1/charges?to=alice")
    b = facts(url="https://api.example.com/v1/charges?to=bob")
    assert key_of(rules, a) != key_of(rules, b)
    assert "alice" not in key_of(rules, a)


def test_a_key_whose_value_is_missing_falls_back_to_the_body_hash():
    rule = make("order").model_dump() | {"key": "{header.X-Order-Id}"}
    rules = RuleSet([Rule.model_validate(rule)])
    with_id = facts(headers={"X-Order-Id": "ord-7"}, body=b"{}")
    without = facts(body=b"{}")
    assert key_of(rules, with_id) == "ord-7"
    assert key_of(rules, without).startswith("order:POST /v1/charges#")


def webhook(key=None):
    fields = {
        "name": "hook",
        "match": {"host": "hooks.example.com", "path": "/services/{team}/{secret}"},
        "effect": "non_idempotent",
        "redact": {"params": ["secret"]},
    }
    return RuleSet([Rule.model_validate(fields | ({"key": key} if key else {}))])


def hook_key(rules, secret, body=b'{"text": "hi"}'):
    request = facts(url=f"https://hooks.example.com/services/T1/{secret}", body=body)
    found = rules.match(request)
    assert found.secrets == (secret,)
    return found.key(request)


@pytest.mark.parametrize("key", [None, "{team}:{secret}", "{path}"])
def test_a_secret_parameter_is_in_the_effect_key_only_as_a_hash(key):
    rules = webhook(key)
    one, two = hook_key(rules, "XXXX-secret-1"), hook_key(rules, "XXXX-secret-2")
    assert "XXXX" not in one + two
    assert "[redacted:" in one
    assert one != two  # two secrets: two effects
    assert hook_key(rules, "XXXX-secret-1") == one  # the same: one effect, every attempt


def test_the_default_key_with_a_secret_keeps_the_rest_of_the_path():
    key = hook_key(webhook(), "XXXX")
    digest = hashlib.sha256(b"XXXX").hexdigest()[:16]
    assert key.startswith(f"hook:POST /services/T1/[redacted:{digest}]#")


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (facts(body=b'{"a":1,"b":2}'), facts(body=b'{"b": 2, "a": 1}'), True),
        (
            facts(url="https://api.example.com/v1/charges?x=1&y=2"),
            facts(url="https://api.example.com/v1/charges?y=2&x=1"),
            True,
        ),
        (facts(headers={"A": "1"}), facts(headers={"A": "2"}), True),  # headers do not count
        (facts(body=b'{"a":1}'), facts(body=b'{"a":2}'), False),
        (facts(), facts(method="PUT"), False),
        (facts(), facts(url="https://api.example.com/v1/refunds"), False),
        (facts(url="https://api.example.com/v1/charges?x=1"), facts(), False),
    ],
)
def test_the_fingerprint_is_method_path_query_and_canonical_body(a, b, same):
    assert (fingerprint(a) == fingerprint(b)) is same
    assert fingerprint(a).startswith("v2:sha256:")


def _v1(f):
    """A fingerprint as sidecars before version 2 recorded it."""
    digest = hashlib.sha256()
    digest.update(f"{f.method}\n{f.path}\n{urlencode(sorted(f.query.items()))}\n".encode())
    digest.update(canonical_body(f))
    return "sha256:" + digest.hexdigest()


def test_a_fingerprint_recorded_by_an_older_sidecar_is_compared_in_its_own_version():
    recorded = _v1(facts(body=b'{"title": "T\\u00e9", "n": 1}'))
    assert recorded != fingerprint(facts(body=b'{"title": "T\\u00e9", "n": 1}'))

    def same(recorded, now):
        return same_payload(recorded, now, fingerprint(now))

    assert same(recorded, facts(body=b'{"n":1,"title":"T\xc3\xa9"}'))
    assert not same(recorded, facts(body=b'{"n":2,"title":"T\xc3\xa9"}'))
    assert same(fingerprint(facts(body=b"[1]")), facts(body=b" [ 1 ] "))
    assert not same(fingerprint(facts(body=b"[1]")), facts(body=b"[2]"))
    assert not same("v3:sha256:0000", facts(body=b"[1]"))  # a version it does not know


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b'{"a": NaN}', b'{"a": null}'),  # orjson writes NaN and infinities as null
        (b'{"a": Infinity}', b'{"a": -Infinity}'),
        (b'{"a": 1e400}', b'{"a": null}'),
        (b"[18446744073709551616]", b"[18446744073709551615]"),  # beyond 64 bits
        (b'["\\ud800"]', b'["\\ud801"]'),  # lone surrogates
        (b"[" * 300 + b"1" + b"]" * 300, b"[" * 300 + b"2" + b"]" * 300),  # deeper than orjson
        (b'orjson\n{"a":1}', b'{"a":1}'),  # raw bytes that spell a tagged form
        (b'json\n{"a":1}', b'{"a":1}'),
    ],
)
def test_values_orjson_cannot_write_exactly_still_tell_payloads_apart(a, b):
    assert fingerprint(facts(body=a)) != fingerprint(facts(body=b))


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (b'{"b": [1, NaN], "a": null}', b'{"a":null,"b":[1,NaN]}'),
        (b'{"big": 18446744073709551616, "x": 1}', b'{"x":1,"big":18446744073709551616}'),
        (b'{"s": "\\ud800", "t": 2}', b'{"t":2,"s":"\\ud800"}'),
        (b'{"a": null, "b": "nullable"}', b'{"b":"nullable","a":null}'),
    ],
)
def test_the_form_depends_on_the_value_so_key_order_and_spacing_never_count(a, b):
    assert fingerprint(facts(body=a)) == fingerprint(facts(body=b))


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


@given(_json_values, _json_values, st.randoms())
def test_two_bodies_get_one_fingerprint_exactly_when_they_hold_one_value(one, other, rnd):
    def spelled(value):
        """``value`` as JSON text, keys shuffled and spaced at random."""
        if isinstance(value, dict):
            items = list(value.items())
            rnd.shuffle(items)
            inner = ", ".join(f"{json.dumps(k)} :{spelled(v)}" for k, v in items)
            return "{ " + inner + "}"
        if isinstance(value, list):
            return "[" + " ,".join(spelled(v) for v in value) + " ]"
        return json.dumps(value)

    def prints(value):
        return fingerprint(facts(body=spelled(value).encode("utf-8", "surrogatepass")))

    assert prints(one) == prints(one)
    same = json.dumps(one, sort_keys=True) == json.dumps(other, sort_keys=True)
    assert (prints(one) == prints(other)) is same
