"""What the sidecar would do with one HTTP request or one SQL text, as JSON-ready data.

``sidecar rules explain`` prints it and ``POST /v1/rules/explain`` answers it: the rule
that wins (and the later ones it shadows there), the effect key and where it comes from,
the fingerprint, the idempotency key sent upstream, the probe an unknown outcome would
send - or, for a write no rule covers, its path shape and a rule to start from.  Nothing
is sent and nothing is recorded: this reads only the rules.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from sidecar.domain.ids import idempotency_key
from sidecar.rules.facts import HttpRequestFacts
from sidecar.rules.matcher import RuleMatch, RuleSet, SqlRuleMatch, fingerprint, http_match
from sidecar.rules.model import EffectKind, OnUnknown, Protocol, Rule
from sidecar.rules.shapes import as_template, request_shape
from sidecar.rules.sql import Statement, matches, split
from sidecar.rules.templates import TemplateValueMissing

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ATTEMPT = "ATTEMPT_ID"  # stands for the attempt id the sidecar mints at run time


def explain_http(rules: RuleSet, facts: HttpRequestFacts) -> dict[str, Any]:
    """What the sidecar would do with this request."""
    candidates = [
        (rule, params)
        for rule in rules
        if rule.http is not None and (params := http_match(rule.http, facts)) is not None
    ]
    out: dict[str, Any] = {
        "request": {"method": facts.method, "host": facts.host, "path": facts.path},
        "intercepted": rules.may_match_host(facts.host, facts.port),
    }
    if not candidates:
        return out | _unmatched(facts)
    rule, params = candidates[0]
    match = RuleMatch(rule, params)
    out |= {
        "rule": {
            "name": rule.name,
            "at": _where(rules, rule),
            "effect": rule.effect.value,
            "params": dict(match.params),
        },
        "shadows": _shadows(rules, candidates[1:]),
    }
    if not rule.logged:
        return out | {"disposition": "passthrough"}
    key = match.key(facts)
    return out | {
        "disposition": "guarded",
        "effect_key": key,
        "key_from": _key_source(match, facts),
        "fingerprint": fingerprint(facts),
        "idempotency": (
            {
                "header": rule.idempotency_header,
                "value": idempotency_key(ATTEMPT, key),
                "shape": "{attempt_id}:{sha256(key)[:16]}",
            }
            if rule.idempotency_header
            else None
        ),
        "on_unknown": rule.on_unknown.value,
        "on_divergence": rule.on_divergence.value,
        "probe": _probe(match, facts),
    }


def explain_sql(
    rules: RuleSet, sql: str, parameters: tuple[bytes | None, ...] = ()
) -> dict[str, Any]:
    """Each statement of ``sql``: its rule, the later rules shadowed, and its key as an
    attempt running this text would record it (the n-th run of one key is ``KEY #n``)."""
    runs: Counter[str] = Counter()
    statements: list[dict[str, Any]] = []
    for text in split(sql):
        statement = Statement.of(text)
        candidates = [
            (rule, found)
            for rule in rules
            if rule.sql is not None and (found := matches(rule.sql.sql, statement))
        ]
        entry: dict[str, Any] = {"statement": statement.normalised, "kind": statement.kind}
        statements.append(entry)
        if not candidates:
            entry |= {"rule": None, "disposition": "passthrough"}
            continue
        rule, found = candidates[0]
        entry["rule"] = {"name": rule.name, "at": _where(rules, rule), "effect": rule.effect.value}
        entry["shadows"] = _shadows(rules, candidates[1:])
        if rule.effect is not EffectKind.NON_IDEMPOTENT:
            entry["disposition"] = "passthrough"
            continue
        base = SqlRuleMatch(rule, found).key(statement, parameters)
        entry["disposition"] = "guarded"
        if statement.comment_key is not None:
            entry |= {"effect_key": base, "ordinal": None}
            entry["ordinal_note"] = "named by its sidecar:key comment: once per task, no ordinal"
            continue
        runs[base] += 1
        ordinal = runs[base]
        entry |= {
            "effect_key": base if ordinal == 1 else f"{base} #{ordinal}",
            "ordinal": ordinal,
            "ordinal_note": "the n-th run of the same key in one attempt is KEY #n; a new "
            "attempt counts from 1 again and is answered from the log",
        }
    return {"statements": statements}


def _where(rules: RuleSet, rule: Rule) -> str:
    source = rules.sources.get(rule.name)
    return f"{source.file}:{source.line}" if source else ""


def _shadows(rules: RuleSet, later: Sequence[tuple[Rule, object]]) -> list[dict[str, str]]:
    return [{"name": rule.name, "at": _where(rules, rule)} for rule, _ in later]


def _unmatched(facts: HttpRequestFacts) -> dict[str, Any]:
    """A request no rule matches: a read passes through; a write is uncovered."""
    if facts.method not in WRITES:
        return {"rule": None, "disposition": "passthrough"}
    shape = request_shape(facts.path)
    suggested = {"host": facts.host, "method": facts.method, "path": as_template(shape)}
    return {
        "rule": None,
        "disposition": "uncovered",
        "uncovered": {"shape": shape, "suggested_match": suggested},
    }


def _key_source(match: RuleMatch, facts: HttpRequestFacts) -> str:
    rule = match.rule
    if rule.protocol is Protocol.GIT_RECEIVE_PACK:
        return "the pushed refs (git-receive-pack: the body names them)"
    if rule.key is None:
        return "no 'key': method, path and a hash of the body (and query)"
    try:
        rule.key.render(facts, match.params)
    except TemplateValueMissing as missing:
        return (
            f"'key' {rule.key.source!r} cannot be rendered ({missing}): fell back to the body hash"
        )
    return f"'key' {rule.key.source!r}"


def _probe(match: RuleMatch, facts: HttpRequestFacts) -> dict[str, Any] | None:
    rule = match.rule
    if rule.protocol is Protocol.GIT_RECEIVE_PACK:
        return {"builtin": "the repository's advertised refs (GET info/refs)"}
    spec = rule.probe
    if spec is None or rule.on_unknown is not OnUnknown.PROBE:
        return None
    probe: dict[str, Any] = {
        "method": spec.request.method,
        "host": spec.request.host or facts.host,
        "found": spec.found.source,
        "answer_status": spec.answer.status,
    }
    try:
        probe["path"] = spec.request.path.render(facts, match.params)
        probe["headers"] = {
            n: t.render(facts, match.params) for n, t in spec.request.headers.items()
        }
    except TemplateValueMissing as missing:
        probe["error"] = f"cannot build the probe for this request: {missing}"
    return probe
