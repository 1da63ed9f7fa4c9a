"""Rule patterns run in linear time, and what cannot is refused when the rules are loaded."""

from __future__ import annotations

import re
import time
from pathlib import Path
from textwrap import dedent

import pytest
import re2  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from sidecar.cli import main
from sidecar.rules import PathTemplate, load_rules
from sidecar.rules.regex import LinearPattern, compile_pattern
from sidecar.rules.sql import Statement

EVIL = "^(a|aa)+$"  # exponential for a backtracking engine on a run of 'a's and a '!'


def rules_from(tmp_path: Path, text: str):
    path = tmp_path / "app.yaml"
    path.write_text(dedent(text))
    return load_rules([path])


def sql_rule(tmp_path: Path, regex: str):
    return rules_from(
        tmp_path,
        f"""\
        rules:
          - name: app.evil
            match: {{sql: {{regex: '{regex}'}}}}
            effect: non_idempotent
        """,
    )


def test_every_pattern_a_rule_writes_is_compiled_by_the_linear_engine(tmp_path):
    rules = rules_from(
        tmp_path,
        """\
        rules:
          - name: app.sql
            match: {sql: {regex: "into ledger"}}
            effect: non_idempotent
          - name: app.http
            match: {host: "*.example.com", path: "/v1/{rest*}/things"}
            effect: non_idempotent
        """,
    )
    sql, http = rules
    assert isinstance(sql.sql.sql.regex, LinearPattern)
    assert isinstance(http.http.host[0].regex, LinearPattern)
    # Path templates make only patterns re runs in linear time (and faster than RE2).
    assert isinstance(http.http.path.regex, re.Pattern)


@pytest.mark.timeout(20)  # a backtracking engine would still be at it in a year
def test_a_pattern_that_backtracks_exponentially_answers_at_once(tmp_path):
    rules = sql_rule(tmp_path, EVIL)
    started = time.perf_counter()
    assert rules.match_sql(Statement.of("a" * 5000 + "!")) is None
    assert rules.match_sql(Statement.of("a" * 5000)) is not None
    assert time.perf_counter() - started < 1.0


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "template",
    [
        "/{a}/{b}/{c}",
        "/v{a}.x/{b}.x/{c}.x",
        "/bot{a}/send{b}/{c}",
        "/{a}/x",
        "/{a*}/x/{b}",
        "/v{a}.x/{rest*}/send{b}/{c}.x",
    ],
)
def test_a_template_answers_a_hostile_path_at_once(template):
    # Long runs of what a parameter takes, the literal after it repeated inside, and a
    # last character that fails: each segment still matches at most one way.
    compiled = PathTemplate.parse(template)
    started = time.perf_counter()
    for filler in ("a", ".x", "send", "x/", "/"):
        for tail in ("!", "/", "//", "/y/z", "/x/b"):
            compiled.match("/" + filler * 20_000 + "/" + filler * 20_000 + tail)
    assert time.perf_counter() - started < 1.0


_SEGMENTS = st.sampled_from(["{p}", "v{p}", "{p}.json", "bot{p}", "a", "b.c", "x-y"])
# Paths made of the templates' own pieces (so that many match) or of loose characters.
_PATH_TEXT = st.lists(
    st.sampled_from(["a", "b.c", "x-y", "va", "bot7", "7.json", "", "\n", "a\udcffb", "%2F"]),
    max_size=7,
).map("/".join) | st.text(alphabet="ab./-{}%\n\udcff.jsonvbot", max_size=30)


def _on_re2(source: str) -> LinearPattern:
    """The oracle: a template as one pattern on RE2 - each {name} one non-empty segment
    ([^/]+), a {name*} one or more (a lazy .+?), a trailing slash optional."""
    pieces = []
    for segment in source.strip("/").split("/") if source != "/" else []:
        found = re.fullmatch(r"(.*)\{(\w+)(\*?)\}(.*)", segment)
        if found is None:
            pieces.append(re2.escape(segment))
            continue
        before, name, star, after = found.groups()
        capture = f"(?P<{name}>{'.+?' if star else '[^/]+'})"
        pieces.append(re2.escape(before) + capture + re2.escape(after))
    return compile_pattern("/" + "/".join(pieces) + ("/?" if pieces else ""))


@given(
    segments=st.lists(_SEGMENTS, min_size=0, max_size=4),
    star_at=st.none() | st.integers(0, 4),
    path=_PATH_TEXT,
)
def test_a_template_matches_as_the_one_pattern_on_the_linear_engine_would(segments, star_at, path):
    if star_at is not None:
        segments.insert(min(star_at, len(segments)), "{rest*}")
    numbered = [segment.replace("{p}", f"{{p{at}}}") for at, segment in enumerate(segments)]
    template = PathTemplate.parse("/" + "/".join(numbered))
    oracle = _on_re2(template.source)
    for text in (path, "/" + path, "/" + path + "/"):
        found = oracle.fullmatch(text)
        expected = None if found is None else {n: found.group(n) for n in template.params}
        assert template.match(text) == expected, text


def test_a_path_that_is_not_utf8_is_matched_not_refused(tmp_path):
    rules = rules_from(
        tmp_path,
        """\
        rules:
          - name: app.http
            match: {host: api.example.com, path: "/v1/{id}/things"}
            effect: non_idempotent
        """,
    )
    (rule,) = rules
    # mitmproxy hands raw bytes that are not UTF-8 over as lone surrogates.
    assert rule.http.path.match("/v1/a\udcffb/things") == {"id": "a\udcffb"}


def test_sql_regex_groups_still_name_the_effect(tmp_path):
    rules = sql_rule(tmp_path, "into invoices_(?P<year>[0-9]{4})")
    found = rules.match_sql(Statement.of("INSERT INTO Invoices_2026 VALUES (1)"))
    assert found is not None
    assert found.found.group("year") == "2026"


@pytest.mark.parametrize(
    ("regex", "says"),
    [
        ("(a)\\\\1", "pattern '(a)\\\\1' uses a backreference, which the linear-time matcher"),
        ("(?P<x>a)(?P=x)", "uses a backreference"),
        ("^(?!create temp)", "uses a lookahead or lookbehind"),
        ("(?<=x)y", "uses a lookahead or lookbehind"),
        ("a++", "possessive quantifier"),
        ("end\\\\Z", "write \\z for the end of the text"),
        ("(unclosed", "invalid regular expression '(unclosed': missing )"),
    ],
)
def test_rules_check_refuses_what_the_linear_engine_cannot_run_at_its_line(
    tmp_path, capsys, regex, says
):
    path = tmp_path / "app.yaml"
    path.write_text(
        "rules:\n"
        "  - name: app.fine\n"
        "    match: {sql: {kind: ALTER}}\n"
        "    effect: non_idempotent\n"
        "  - name: app.bad\n"
        "    match:\n"
        "      sql:\n"
        f'        regex: "{regex}"\n'
        "    effect: non_idempotent\n"
    )
    assert main(["rules", "check", str(path)]) == 1
    (problem, summary) = capsys.readouterr().err.splitlines()
    assert problem.startswith(f"{path}:8: rules[1].match.sql.regex: ")
    assert says in problem
    assert summary == "rules check: 1 problem"
