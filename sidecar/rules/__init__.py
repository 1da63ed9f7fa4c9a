"""Rules: which outbound requests are effects, how to key them and how to probe for them.

``load_rules`` reads the YAML rule files (SPEC §5) into a :class:`RuleSet`.  The HTTP
proxy asks it ``match`` for each request (the request as :class:`HttpRequestFacts`), then
the :class:`RuleMatch` for its ``key``, and :func:`fingerprint` for the request's
fingerprint; the PostgreSQL relay asks ``match_sql`` for each statement (:mod:`.sql`),
then the :class:`~.matcher.SqlRuleMatch` for its ``key``.  Three kinds of rule: HTTP, git
push (``protocol: git-receive-pack``) and SQL (``match: {sql: ...}``).  :mod:`.explain`
says what the sidecar would do with one request or SQL text, from the rules alone.
"""

from __future__ import annotations

from sidecar.rules.facts import HttpRequestFacts
from sidecar.rules.loader import RuleError, RuleProblem, load_rules
from sidecar.rules.matcher import (
    RuleMatch,
    RuleSet,
    RuleSource,
    canonical_body,
    fingerprint,
    same_payload,
)
from sidecar.rules.model import (
    CheckpointSpec,
    EffectKind,
    ExistsWhen,
    HttpMatch,
    OnDivergence,
    OnUnknown,
    ProbeAnswer,
    ProbeRequest,
    ProbeSpec,
    Protocol,
    Rule,
    RuleFile,
)
from sidecar.rules.patterns import HostPattern, PathTemplate
from sidecar.rules.templates import (
    Encoding,
    Expression,
    Template,
    TemplateSyntaxError,
    TemplateValueMissing,
    UrlTemplate,
)

__all__ = [
    "CheckpointSpec",
    "EffectKind",
    "Encoding",
    "ExistsWhen",
    "Expression",
    "HostPattern",
    "HttpMatch",
    "HttpRequestFacts",
    "OnDivergence",
    "OnUnknown",
    "PathTemplate",
    "ProbeAnswer",
    "ProbeRequest",
    "ProbeSpec",
    "Protocol",
    "Rule",
    "RuleError",
    "RuleFile",
    "RuleMatch",
    "RuleProblem",
    "RuleSet",
    "RuleSource",
    "Template",
    "TemplateSyntaxError",
    "TemplateValueMissing",
    "UrlTemplate",
    "canonical_body",
    "fingerprint",
    "load_rules",
    "same_payload",
]
