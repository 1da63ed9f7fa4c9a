"""Warnings about rules that load but probably do not do what their author meant.

* A keyless ``non_idempotent`` HTTP rule: its effect key is a hash of the request body,
  so an agent that words the same comment differently on resume (an LLM does) makes a
  second effect and posts it twice.  ``key`` should name what makes two requests the
  same effect.
* A method no HTTP client sends but by name (``PSOT``): methods are extensible (WebDAV's
  PROPFIND, a cache's PURGE), so it loads, but the nearest standard one is suggested.
* A rule that can never match: an earlier rule (load order, the first match wins)
  matches every request it would.  Conservative, so a warning is always true: the earlier
  rule has the same hosts (or ``*``), the same methods or more, the same path template
  (parameter names aside) or none, and no query or header condition the later one lacks.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator

from sidecar.rules.matcher import RuleSet, RuleSource
from sidecar.rules.model import EffectKind, HttpMatch, Protocol, Rule
from sidecar.rules.sql import SqlCondition

_PARAM = re.compile(r"\{([^{}]*)\}")
# RFC 9110's methods, PATCH (RFC 5789), and those of WebDAV (RFC 4918, 3253) and caches.
_METHOD_WORDS = (
    "GET HEAD POST PUT DELETE CONNECT OPTIONS TRACE PATCH PROPFIND PROPPATCH MKCOL COPY "
    "MOVE LOCK UNLOCK REPORT MKACTIVITY CHECKOUT MERGE SEARCH PURGE QUERY"
)
KNOWN_METHODS = frozenset(_METHOD_WORDS.split())


def rule_warnings(rules: RuleSet) -> list[tuple[RuleSource, str]]:
    found: list[tuple[RuleSource, str]] = []
    ordered = list(rules)
    for at, rule in enumerate(ordered):
        source = rules.sources.get(rule.name)
        if source is None:
            continue
        if keyless(rule):
            found.append(
                (
                    source,
                    f"rule {rule.name} is non_idempotent without a 'key': its effect key is a "
                    "hash of the body, so a resumed agent that rewords it (an LLM rephrasing "
                    "a comment) sends it twice; say in 'key' what makes two requests one effect",
                )
            )
        for method in unusual_methods(rule):
            close = difflib.get_close_matches(method, KNOWN_METHODS, n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            found.append(
                (
                    source,
                    f"rule {rule.name} matches method {method}, which is no standard HTTP "
                    f"method{hint}",
                )
            )
        for earlier in shadowing(ordered[:at], rule):
            where = rules.sources.get(earlier.name)
            place = f" ({where.file}:{where.line})" if where else ""
            found.append(
                (
                    source,
                    f"rule {rule.name} can never match: rule {earlier.name}{place} comes "
                    "first and matches every request it would",
                )
            )
            break
    return found


def unusual_methods(rule: Rule) -> list[str]:
    methods = rule.http.method if rule.http is not None else None
    return [method for method in methods or () if method not in KNOWN_METHODS]


def keyless(rule: Rule) -> bool:
    return (
        rule.http is not None
        and rule.effect is EffectKind.NON_IDEMPOTENT
        and rule.protocol is Protocol.HTTP
        and rule.key is None
    )


def shadowing(earlier: list[Rule], rule: Rule) -> Iterator[Rule]:
    """The earlier rules that match every request ``rule`` would (conservatively)."""
    for first in earlier:
        if rule.http is not None and first.http is not None:
            if covers(first.http, rule.http):
                yield first
        elif (
            rule.sql is not None
            and first.sql is not None
            and covers_sql(first.sql.sql, rule.sql.sql)
        ):
            yield first


def template_shape(template: str) -> str:
    """A path template with its parameter names erased: ``/a/{x}`` and ``/a/{y}`` alike."""
    return _PARAM.sub(lambda m: "{*}" if m.group(1).endswith("*") else "{}", template).rstrip("/")


def covers(first: HttpMatch, later: HttpMatch) -> bool:
    first_hosts = {h.source.lower() for h in first.host}
    if "*" not in first_hosts and not {h.source.lower() for h in later.host} <= first_hosts:
        return False
    if first.method is not None and (
        later.method is None or not set(later.method) <= set(first.method)
    ):
        return False
    if first.path is not None and (
        later.path is None or template_shape(first.path.source) != template_shape(later.path.source)
    ):
        return False
    for mine, theirs in ((first.query, later.query), (first.headers, later.headers)):
        for name, value in mine.items():
            if name not in theirs or value not in ("*", theirs[name]):
                return False
    return True


def covers_sql(first: SqlCondition, later: SqlCondition) -> bool:
    if first.regex is not None:
        return False  # two regexes cannot be compared
    if first.comment and not later.comment:
        return False
    return not first.kind or (bool(later.kind) and set(later.kind) <= set(first.kind))
