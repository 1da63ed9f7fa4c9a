"""Which rule a request or SQL statement falls under, and the effect key and fingerprint
a request gets.

Matching uses the request line and headers only, never the body, so the proxy can decide
from the headers alone whether it must buffer a request (a matched write) or may stream
it (everything else). The body is read afterwards, for keys and fingerprints.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import orjson

from sidecar.rules.facts import HttpRequestFacts, rule_host
from sidecar.rules.model import HttpMatch, Rule
from sidecar.rules.regex import LinearMatch
from sidecar.rules.sql import Statement
from sidecar.rules.sql import effect_key as sql_effect_key
from sidecar.rules.sql import matches as sql_matches
from sidecar.rules.templates import TemplateValueMissing
from sidecar.runtime.kept import keep


@dataclass(frozen=True, slots=True)
class RuleMatch:
    rule: Rule
    params: Mapping[str, str]  # path parameters, in URL form

    @property
    def secrets(self) -> tuple[str, ...]:
        """The values of the path parameters the rule marks secret (``redact.params``)."""
        named = self.rule.redact.params
        return tuple(self.params[n] for n in named if self.params.get(n)) if named else ()

    def key(self, facts: HttpRequestFacts) -> str:
        """The effect key: the rule's ``key`` rendered for this request.

        Without a ``key``, or when the request lacks a value the key names, the key is
        ``"{rule}:{METHOD} {path}#{digest}"`` where digest is the first 16 hex digits of
        the sha256 of the canonical body (:func:`canonical_body`), preceded by the sorted
        query and a newline when there is a query. So the same request - the same JSON
        whatever its key order or spacing, or the same bytes - gets the same key, and
        the query, which may carry secrets, is not written in clear.  A path parameter
        the rule marks secret is its :func:`secret_digest`, in the path and in a ``key``.
        """
        rule = self.rule
        facts, params = _without_secrets(self, facts)
        if rule.key is not None:
            try:
                return rule.key.render(facts, params)
            except TemplateValueMissing:
                pass  # fall back to the request itself, documented above
        digest = hashlib.sha256()
        if facts.query:
            digest.update(f"{urlencode(sorted(facts.query.items()))}\n".encode())
        digest.update(canonical_body(facts))
        return f"{rule.name}:{facts.method} {facts.path}#{digest.hexdigest()[:16]}"


def secret_digest(value: str) -> str:
    """What a secret path parameter is in an effect key: two secrets stay two keys, and
    the key (stored, logged, shown by the control API) never holds the secret itself."""
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"[redacted:{digest}]"


def _without_secrets(
    match: RuleMatch, facts: HttpRequestFacts
) -> tuple[HttpRequestFacts, Mapping[str, str]]:
    """The facts and parameters a key is made of, each secret parameter as its digest."""
    secrets = set(match.secrets)
    if not secrets:
        return facts, match.params
    params = {n: secret_digest(v) if v in secrets else v for n, v in match.params.items()}
    path = facts.path
    for secret in sorted(secrets, key=len, reverse=True):
        path = path.replace(secret, secret_digest(secret))
    return dataclasses.replace(facts, path=path), params


@dataclass(frozen=True, slots=True)
class SqlRuleMatch:
    rule: Rule
    found: LinearMatch | bool  # the regex match when the rule has a regex

    def key(self, statement: Statement, parameters: tuple[bytes | None, ...] = ()) -> str:
        assert self.rule.sql is not None
        return sql_effect_key(self.rule.name, self.rule.sql.sql, statement, self.found, parameters)


@dataclass(frozen=True, slots=True)
class RuleSource:
    """Where a rule was defined."""

    file: Path
    line: int


def canonical_body(facts: HttpRequestFacts) -> bytes:
    """JSON with sorted keys and no spaces for a JSON body; the raw bytes otherwise.

    What an effect key without a ``key`` template is made of: a key is looked up in the
    effect log, so this form never changes (the fingerprint has its own, versioned one).
    """
    data = facts.json_body()
    if data is None:
        return facts.body or b""
    return _json_canonical(data)


def _json_canonical(data: Any) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


#: the prefix of the fingerprints recorded before version 2: their body was canonicalised
#: by :func:`canonical_body` (``json.dumps``), which costs about 2 ms per MiB of JSON.
FINGERPRINT_V1 = "sha256:"
FINGERPRINT_V2 = "v2:sha256:"


def fingerprint(facts: HttpRequestFacts) -> str:
    """``v2:sha256:HEX`` over method, path, sorted query and canonical body.

    Two requests with the same effect key but different fingerprints are a divergent
    replay (SPEC §3). Header order, JSON key order and whitespace do not count.  Compare
    a recorded fingerprint with :func:`same_payload`, which knows the older version.
    """
    return FINGERPRINT_V2 + _digest(facts, *_canonical_body_v2(facts))


def same_payload(recorded: str, facts: HttpRequestFacts, current: str) -> bool:
    """Whether ``facts`` (whose :func:`fingerprint` is ``current``) has the payload a
    fingerprint was recorded for, in the version it was recorded in: an effect recorded
    by an older sidecar is not a divergent replay only because the fingerprint's
    canonical form changed since (that version's is computed only for such an effect)."""
    if recorded == current:
        return True
    v1 = recorded.startswith(FINGERPRINT_V1)
    return v1 and recorded == FINGERPRINT_V1 + _digest(facts, canonical_body(facts))


def _digest(facts: HttpRequestFacts, *body: bytes) -> str:
    digest = hashlib.sha256()
    query = urlencode(sorted(facts.query.items())) if facts.query else ""  # 2 us if not
    digest.update(f"{facts.method}\n{facts.path}\n{query}\n".encode())
    for part in body:  # apart, not joined: a copy of a large body costs more than a call
        digest.update(part)
    return digest.hexdigest()


def _canonical_body_v2(facts: HttpRequestFacts) -> tuple[bytes, bytes]:
    """The body as version 2 of the fingerprint sees it, tagged by the form it took (so
    no two forms can collide): the raw bytes when it is not JSON; else JSON with sorted
    keys by orjson (some 30x faster than ``json.dumps``) unless the value holds what
    orjson cannot write exactly - integers beyond 64 bits, lone surrogates, nesting
    deeper than 254 (it raises) or NaN and infinities (it writes them as null) - which
    ``json.dumps`` writes.  The form depends on the parsed value only, so the same JSON
    in any key order or spacing gets the same fingerprint."""
    data = facts.json_body()
    if data is None:
        return b"raw\n", facts.body or b""
    try:
        fast = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one
        return b"json\n", _json_canonical(data)
    # Only a body ``json`` parsed may hold NaN: then the search (~0.5 ms per MiB; the
    # dump itself ~0.06) tells NaN from null without walking the value in Python.
    if not facts.json_body_finite() and b"null" in fast and not _all_finite(data):
        return b"json\n", _json_canonical(data)
    return b"orjson\n", fast


def _all_finite(data: Any) -> bool:
    """No NaN or infinity anywhere in ``data`` (asked only when orjson wrote a null)."""
    try:
        json.dumps(data, allow_nan=False)  # C speed; the only thing it refuses here
    except ValueError:
        return False
    return True


def http_match(condition: HttpMatch, facts: HttpRequestFacts) -> dict[str, str] | None:
    """The path parameters if every condition holds, else None."""
    if not any(host.matches(facts.host, facts.port) for host in condition.host):
        return None
    return _match_beyond_host(condition, facts)


def _match_beyond_host(condition: HttpMatch, facts: HttpRequestFacts) -> dict[str, str] | None:
    """:func:`http_match` for a request whose host is known to match."""
    if condition.method is not None and facts.method not in condition.method:
        return None
    for source, wanted in ((facts.query, condition.query), (facts.headers, condition.headers)):
        for name, value in wanted.items():
            got = source.get(name)
            if got is None or value not in ("*", got):
                return None
    if condition.path is None:
        return {}
    return condition.path.match(facts.path)


#: How many (host, port) answers of :meth:`RuleSet.rules_on_host` are kept, and for
#: hosts up to what length (a DNS name's 253, an IPv6 address in brackets): ~1.5 MiB.
HOSTS_KEPT = 4096
HOST_KEPT_LENGTH = 255
#: ... and of :meth:`RuleSet._rules_for`, per method too, for methods up to this long
#: (the registered ones are at most 17 characters).
METHOD_KEPT_LENGTH = 32


class RuleSet:
    """Rules in load order: the first rule whose conditions all hold wins."""

    def __init__(
        self,
        rules: Sequence[Rule] = (),
        sources: Mapping[str, RuleSource] | None = None,
        files: Sequence[Path] = (),
    ) -> None:
        self.rules = tuple(rules)
        self.sources = dict(sources or {})
        self.files = tuple(files)
        self._by_name = {rule.name: rule for rule in self.rules}
        self._hosts: dict[tuple[str, int | None], tuple[Rule, ...]] = {}
        self._by_method: dict[tuple[str, int | None, str], tuple[Rule, ...]] = {}

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def get(self, name: str) -> Rule | None:
        return self._by_name.get(name)

    def match(self, facts: HttpRequestFacts) -> RuleMatch | None:
        for rule in self._rules_for(facts.host, facts.port, facts.method):
            assert rule.http is not None  # rules_on_host holds HTTP rules only
            params = _match_beyond_host(rule.http, facts)
            if params is not None:
                return RuleMatch(rule, params)
        return None

    def _rules_for(self, host: str, port: int | None, method: str) -> tuple[Rule, ...]:
        """:meth:`rules_on_host` without the rules that name other methods, kept like it:
        a GET to api.github.com otherwise tried the pack's 20 rules for writes first."""
        known = self._by_method.get((host, port, method))
        if known is None:
            known = tuple(
                rule
                for rule in self.rules_on_host(host, port)
                if rule.http is not None
                and (rule.http.method is None or method in rule.http.method)
            )
            if len(host) <= HOST_KEPT_LENGTH and len(method) <= METHOD_KEPT_LENGTH:
                keep(self._by_method, (host, port, method), known, HOSTS_KEPT)
        return known

    def may_match_host(self, host: str, port: int | None = None) -> bool:
        """Whether any rule could match a request to ``host`` (so TLS must be opened)."""
        return bool(self.rules_on_host(rule_host(host), port))

    def rules_on_host(self, host: str, port: int | None = None) -> tuple[Rule, ...]:
        """The HTTP rules, in load order, whose host patterns take ``host`` (lower-case,
        no brackets) on ``port``.

        Asked for every proxied request, about the same few hosts, so the answer is kept
        per host and port: every rule's host patterns, run one after another, cost 12-39
        us per request with the shipped packs' 34 rules, and matching a request to
        api.github.com ran 20 of them again (0.15 us kept)."""
        known = self._hosts.get((host, port))
        if known is None:
            known = tuple(
                rule
                for rule in self.rules
                if rule.http and any(p.matches(host, port) for p in rule.http.host)
            )
            if len(host) <= HOST_KEPT_LENGTH:  # longer ones are no host name
                keep(self._hosts, (host, port), known, HOSTS_KEPT)
        return known

    def match_sql(self, statement: Statement) -> SqlRuleMatch | None:
        """The first SQL rule matching ``statement``."""
        for rule in self.rules:
            if rule.sql is None:
                continue
            found = sql_matches(rule.sql.sql, statement)
            if found:
                return SqlRuleMatch(rule, found)
        return None

    @property
    def has_sql(self) -> bool:
        return any(rule.sql is not None for rule in self.rules)
