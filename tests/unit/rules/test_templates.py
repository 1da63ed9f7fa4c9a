"""Templates, path templates, host patterns and JMESPath: parsed once, rendered per request."""

from __future__ import annotations

import pytest

from sidecar.rules import (
    Expression,
    HostPattern,
    HttpRequestFacts,
    PathTemplate,
    Template,
    TemplateSyntaxError,
    TemplateValueMissing,
    UrlTemplate,
)
from sidecar.rules.templates import Encoding

FACTS = HttpRequestFacts.from_url(
    "post",
    "https://API.github.com:443/repos/octo/hello/pulls?page=2&page=3&q=a%20b",
    {"X-Order-Id": "ord-7", "Content-Type": "application/json"},
    b'{"head": "agent/312/att 9f", "base": "main", "items": [{"id": 7}], "n": 3, "ok": true}',
)
PARAMS = {"owner": "octo", "repo": "hello"}


def render(source: str, facts: HttpRequestFacts = FACTS) -> str:
    return Template.parse(source).render(facts, PARAMS)


def test_a_template_substitutes_path_parameters_and_body_values():
    assert render("{owner}/{repo}#pull:{body.head}->{body.base}") == (
        "octo/hello#pull:agent/312/att 9f->main"
    )


def test_body_placeholders_take_any_jmespath_expression():
    assert render("{body.items[0].id}") == "7"
    assert render("{body.{a: base, b: n}}") == '{"a":"main","b":3}'
    assert render("{body}").startswith('{"base":"main"')


def test_non_string_values_render_as_compact_json():
    assert render("{body.n}|{body.ok}|{body.items}") == '3|true|[{"id":7}]'


def test_query_header_and_builtin_placeholders():
    assert render("{query.page} {query.q}") == "2 a b"  # first value, decoded
    assert render("{header.x-order-id} {header.X-ORDER-ID}") == "ord-7 ord-7"
    assert render("{method} {host} {path}") == "POST api.github.com /repos/octo/hello/pulls"


def test_double_braces_are_literal_braces():
    assert render("{{owner}} {owner}}}") == "{owner} octo}"


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("{nobody}", "no such path parameter"),
        ("{query.missing}", "no such value"),
        ("{header.X-Missing}", "no such value"),
        ("{body.absent}", "no such value"),
        ("{body.length(n)}", "length"),  # a type error at evaluation is a missing value
    ],
)
def test_a_missing_value_raises_naming_the_placeholder(source, reason):
    with pytest.raises(TemplateValueMissing, match=reason) as missing:
        render(source)
    assert missing.value.placeholder == source[1:-1]


def test_a_body_placeholder_on_a_body_that_is_not_json_is_missing():
    facts = HttpRequestFacts.from_url("POST", "https://h/x", body=b"amount=1")
    with pytest.raises(TemplateValueMissing, match="not JSON"):
        render("{body.amount}", facts)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{owner", "unclosed"),
        ("owner}", "unmatched"),
        ("{}", "empty placeholder"),
        ("{body.items[}", "invalid JMESPath"),
        ("{body.nofn(@)}", "no function nofn"),
        ("{query.}", "unknown placeholder"),
        ("{header.bad name}", "unknown placeholder"),
        ("{a-b}", "unknown placeholder"),
    ],
)
def test_template_syntax_errors_are_reported_at_parse_time(source, message):
    with pytest.raises(TemplateSyntaxError, match=message):
        Template.parse(source)


def test_braces_and_quotes_inside_a_body_expression_do_not_end_the_placeholder():
    template = Template.parse('{body."we}ird"}-{body.{x: n}}')
    facts = HttpRequestFacts.from_url("POST", "https://h/", body=b'{"we}ird": 1, "n": 2}')
    assert template.render(facts, {}) == '1-{"x":2}'


def test_path_encoding_percent_encodes_text_but_keeps_url_form_parameters():
    template = Template.parse("/repos/{owner}/branches/{body.head}")
    params = {"owner": "my%20org"}
    assert template.render(FACTS, params, Encoding.PATH) == (
        "/repos/my%20org/branches/agent/312/att%209f"
    )


def test_a_probe_url_encodes_every_value_in_its_query_part():
    url = UrlTemplate.parse("/repos/{owner}/{repo}/pulls?head={owner}:{body.head}&state=all")
    assert url.render(FACTS, PARAMS) == (
        "/repos/octo/hello/pulls?head=octo:agent%2F312%2Fatt%209f&state=all"
    )
    # A path parameter is in URL form already: decoded once before being encoded.
    assert url.render(FACTS, {"owner": "my%20org", "repo": "r"}).endswith(
        "?head=my%20org:agent%2F312%2Fatt%209f&state=all"
    )


def test_a_probe_url_without_query_is_just_a_path():
    url = UrlTemplate.parse("/repos/{owner}/{repo}")
    assert url.query is None
    assert url.render(FACTS, PARAMS) == "/repos/octo/hello"
    with pytest.raises(TemplateSyntaxError, match="must start with '/'"):
        UrlTemplate.parse("repos/{owner}")
    with pytest.raises(TemplateSyntaxError, match="no '#fragment'"):
        UrlTemplate.parse("/repos/{owner}#top")


@pytest.mark.parametrize(
    ("template", "path", "params"),
    [
        (
            "/repos/{owner}/{repo}/pulls",
            "/repos/octo/hello/pulls",
            {"owner": "octo", "repo": "hello"},
        ),
        (
            "/repos/{owner}/{repo}/pulls",
            "/repos/octo/hello/pulls/",
            {"owner": "octo", "repo": "hello"},
        ),
        (
            "/{repo*}/git-receive-pack",
            "/org/sub/repo.git/git-receive-pack",
            {"repo": "org/sub/repo.git"},
        ),
        ("/v1/{resource*}", "/v1/charges/ch_1/capture", {"resource": "charges/ch_1/capture"}),
        ("/v1/{resource*}", "/v1/charges/", {"resource": "charges"}),
        (
            "/bot{token}/send{what}",
            "/bot12:AB-c/sendMessage",
            {"token": "12:AB-c", "what": "Message"},
        ),
        ("/v1/{id}.json", "/v1/7.json", {"id": "7"}),
        ("/v1/charges", "/v1/charges", {}),
        ("/", "/", {}),
    ],
)
def test_path_templates_match_and_capture(template, path, params):
    assert PathTemplate.parse(template).match(path) == params


@pytest.mark.parametrize(
    ("template", "path"),
    [
        ("/repos/{owner}/{repo}/pulls", "/repos/octo/pulls"),  # {name} is one segment
        ("/repos/{owner}/{repo}/pulls", "/repos/octo/a/b/pulls"),
        ("/repos/{owner}/{repo}/pulls", "/repos//hello/pulls"),  # ... and not empty
        ("/v1/charges", "/V1/charges"),  # literals match exactly
        ("/v1/charges", "/v1/charges/x"),
        ("/v1/{resource*}", "/v1/"),
        ("/", "/x"),
        ("/bot{token}/sendMessage", "/bot/sendMessage"),  # text around it: still not empty
        ("/v1/{id}.json", "/v1/7.xml"),
    ],
)
def test_path_templates_refuse_what_they_do_not_describe(template, path):
    assert PathTemplate.parse(template).match(path) is None


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("v1/charges", "must start with '/'"),
        ("/v1/charges?x=1", "no query"),
        ("/v1//charges", "empty segment"),
        ("/v1/{id}{ext}", "at most one {name} per segment"),
        ("/v1/{id", "braces balanced"),
        ("/v1/x{rest*}", "must be a whole segment"),
        ("/v1/{1d}", "not a parameter name"),
        ("/{a}/{a}", "appears twice"),
        ("/{a*}/x/{b*}", "only one"),
    ],
)
def test_bad_path_templates_are_refused(template, message):
    with pytest.raises(TemplateSyntaxError, match=message):
        PathTemplate.parse(template)


def test_host_patterns_are_case_insensitive_globs_with_an_optional_port():
    star = HostPattern.parse("*.Example.com")
    assert star.matches("api.example.com")
    assert star.matches("a.b.example.com")
    assert not star.matches("example.com")
    pinned = HostPattern.parse("api.example.com:8443")
    assert pinned.matches("api.example.com", 8443)
    assert pinned.matches("api.example.com")  # port unknown: cannot rule it out
    assert not pinned.matches("api.example.com", 443)
    assert HostPattern.parse("[::1]:8080").matches("::1", 8080)


@pytest.mark.parametrize("source", ["bad host", "a/b", "h:0", "h:99999", "", "h:x"])
def test_bad_host_patterns_are_refused(source):
    with pytest.raises(TemplateSyntaxError):
        HostPattern.parse(source)


def test_jmespath_expressions_compile_once_and_search():
    found = Expression.compile("length(@) > `0`")
    assert found.search([{"id": 1}]) is True
    assert found.search([]) is False


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("", "empty"),
        ("foo[", "incomplete expression"),
        ("a.'b", "Unclosed"),
        ("foo bar", "Unexpected token"),
        ("lenght(@)", "no function lenght"),
    ],
)
def test_bad_jmespath_is_refused_with_a_one_line_reason(source, message):
    with pytest.raises(TemplateSyntaxError, match=message) as error:
        Expression.compile(source)
    assert "\n" not in str(error.value)
