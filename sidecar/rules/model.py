"""A rule file's schema (SPEC §5), as frozen pydantic models that refuse unknown fields.

Everything a rule says in a small language - host globs, path templates, key and probe
templates, JMESPath expressions - is parsed here, while validating, so a mistake is
reported when the rules are loaded (with its file and line, see ``loader``) and never
when the first matching request arrives.

Cross-field checks raise :class:`FieldProblem`, which names the field at fault so the
loader can point at its line rather than at the whole rule.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from sidecar.rules.parsed import Parsed
from sidecar.rules.patterns import HostPattern, PathTemplate
from sidecar.rules.sql import SqlMatch
from sidecar.rules.templates import BUILTINS, Expression, Source, Template, UrlTemplate

_RULE_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_METHOD = re.compile(r"[A-Z]+")
_TOKEN = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]+")  # an HTTP header name (RFC 9110 token)
_HOST = re.compile(r"(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+)(?::\d{1,5})?")


class EffectKind(StrEnum):
    READ = "read"  # no side effect: passed through untouched
    IDEMPOTENT = "idempotent"  # repeating it is harmless: passed through untouched
    NON_IDEMPOTENT = "non_idempotent"  # at most once per task: logged, replayed, probed
    CACHE = "cache"  # answered from the log when the same request comes again (LLM calls)


class Protocol(StrEnum):
    HTTP = "http"  # a request/response API: keys and probes from the rule's templates
    GIT_RECEIVE_PACK = (
        "git-receive-pack"  # `git push` over smart HTTP: keyed by ref, built-in probe
    )


class OnUnknown(StrEnum):
    """What to do with an effect an earlier attempt left ``pending``/``unknown``."""

    PROBE = "probe"  # ask the outside world (``probe``); not found: send again, same key
    RETRY = "retry"  # send again with the same idempotency key: the API dedupes on it
    BLOCK = "block"  # answer 409 effect_unknown and leave it to a human


class OnDivergence(StrEnum):
    """What to do when a completed effect's key comes again with a different payload."""

    REPLAY = "replay"  # answer the recorded response, flagged X-Sidecar-Divergent
    REJECT = "reject"  # answer 422 payload_mismatch


class FieldProblem(ValueError):
    """A cross-field check failed; ``field`` is the path of the field at fault."""

    def __init__(self, field: tuple[str | int, ...], message: str) -> None:
        self.field = field
        super().__init__(message)


def _what(value: object) -> str:
    names = {dict: "a mapping", list: "a list", bool: "true/false", type(None): "nothing"}
    return names.get(type(value), f"{type(value).__name__} {value!r}")


def _parsing[T](kind: type[T], parse: Callable[[str], T], what: str) -> Callable[[Any], T]:
    def validate(value: Any) -> T:
        if isinstance(value, kind):
            return value
        if not isinstance(value, str):
            raise ValueError(f"expected {what}, got {_what(value)}")  # noqa: TRY004
        return parse(value)

    return validate


def _source(value: Any) -> str:
    return str(value.source)


def _one_or_many(value: Any, what: str) -> list[str]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if not values or not all(isinstance(v, str) for v in values):
        raise ValueError(f"expected {what} or a non-empty list of them, got {_what(value)}")
    return values


def _hosts(value: Any) -> tuple[HostPattern, ...]:
    # HostPatterns (a Rule built in code from another's fields) are taken by their source.
    values = value if isinstance(value, list | tuple) else [value]
    sources = [v.source if isinstance(v, HostPattern) else v for v in values]
    return tuple(HostPattern.parse(v) for v in _one_or_many(sources, "a host pattern"))


def _methods(value: Any) -> tuple[str, ...]:
    methods = tuple(m.upper() for m in _one_or_many(value, "an HTTP method"))
    for method in methods:
        if not _METHOD.fullmatch(method):
            raise ValueError(f"{method!r} is not an HTTP method")
    return methods


JMESPath = Annotated[
    Expression,
    Parsed(_parsing(Expression, Expression.compile, "a JMESPath expression"), _source),
]
TemplateText = Annotated[
    Template,
    Parsed(_parsing(Template, Template.parse, "a template string"), _source),
]
ProbePath = Annotated[
    UrlTemplate,
    Parsed(_parsing(UrlTemplate, UrlTemplate.parse, "a path template"), _source),
]
MatchPath = Annotated[
    PathTemplate,
    Parsed(_parsing(PathTemplate, PathTemplate.parse, "a path template"), _source),
]
Hosts = Annotated[
    tuple[HostPattern, ...],
    Parsed(_hosts, lambda hosts: [h.source for h in hosts]),
]
Methods = Annotated[tuple[str, ...], Parsed(_methods, list)]
Status = Annotated[int, Field(ge=100, le=599)]


def _lower_header_names(headers: dict[str, Any]) -> dict[str, Any]:
    for name in headers:
        if not _TOKEN.fullmatch(name):
            raise ValueError(f"{name!r} is not a header name")
    return {name.lower(): value for name, value in headers.items()}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HttpMatch(_Frozen):
    """Which requests a rule is about; every condition given must hold (body not used)."""

    host: Hosts
    method: Methods | None = None  # None: any
    path: MatchPath | None = None  # None: any path
    query: dict[str, str] = Field(default_factory=dict)  # value "*": present, any value
    headers: dict[str, str] = Field(default_factory=dict)  # names case-insensitive

    @field_validator("headers")
    @classmethod
    def _header_names(cls, headers: dict[str, Any]) -> dict[str, Any]:
        return _lower_header_names(headers)


class ProbeRequest(_Frozen):
    method: str = "GET"
    path: ProbePath
    host: str | None = None  # default: the original request's host
    headers: dict[str, TemplateText] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _header_names(cls, headers: dict[str, Any]) -> dict[str, Any]:
        return _lower_header_names(headers)

    @field_validator("method")
    @classmethod
    def _method(cls, value: str) -> str:
        return _methods(value)[0]

    @field_validator("host")
    @classmethod
    def _host(cls, value: str | None) -> str | None:
        if value is not None and not _HOST.fullmatch(value):
            raise ValueError(f"{value!r} is not HOST or HOST:PORT")
        return value


class ProbeAnswer(_Frozen):
    status: Status
    body: JMESPath | None = None  # None: the probe's whole JSON answer


class ProbeSpec(_Frozen):
    """How to find out whether an effect of unknown outcome happened."""

    request: ProbeRequest
    found: JMESPath  # over the probe's JSON answer; a truthy result means found
    answer: ProbeAnswer
    found_status: tuple[Status, ...] = Field(default=(200,), min_length=1)
    # Answers that mean "not there": the effect did not happen (a GET of one resource).
    missing_status: tuple[Status, ...] = (404,)


class ExistsWhen(_Frozen):
    """An upstream answer that means "it already exists" - evidence, not a failure.

    GitHub answers a second pull request for the same head and base with 422 "A pull
    request already exists": the effect happened (an earlier attempt made it), so the
    sidecar asks the rule's probe for it and answers with what it finds.
    """

    status: tuple[Status, ...] = Field(min_length=1)
    found: JMESPath  # over the answer's JSON body; truthy: the effect already exists


class CheckpointSpec(_Frozen):
    stage: str = Field(min_length=1)
    outputs: dict[str, JMESPath] = Field(default_factory=dict)  # over the response's JSON


def _field_path(value: Any) -> tuple[str, ...]:
    if isinstance(value, tuple):  # a Rule built in code from another's fields
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a field name or dotted path, got {_what(value)}")  # noqa: TRY004
    steps = tuple(value.split("."))
    if not all(steps):
        raise ValueError(
            f"{value!r} is not a field name or dotted path such as 'credentials.password'"
        )
    return steps


FieldPath = Annotated[tuple[str, ...], Parsed(_field_path, ".".join)]


class Redact(_Frozen):
    """Secrets a rule knows of that the effect log must not keep in clear.

    ``params``: path parameters that are secrets (a bot token or webhook secret in the
    URL): ``[redacted]`` wherever the request is shown or logged, a hash in the effect
    key.  ``response``: fields of the recorded answer, as names or dotted paths from the
    top of its JSON (lists on the way are stepped into), stored as ``[redacted]``: the
    agent gets the real answer once, and a replay answers with what was stored.
    """

    params: tuple[str, ...] = ()
    response: tuple[FieldPath, ...] = ()

    @property
    def anything(self) -> bool:
        return bool(self.params or self.response)


def _match_kind(value: Any) -> str:
    """``match: {sql: ...}`` is a SQL rule; anything else an HTTP one."""
    if isinstance(value, SqlMatch) or (isinstance(value, dict) and "sql" in value):
        return "sql"
    return "http"


class Rule(_Frozen):
    """Which requests (``match``) are which kind of effect, and how to name and resolve one.

    ``key`` names what makes two requests the same effect; without one, the request itself
    does (``RuleMatch.key``). ``idempotency_header`` is the header the sidecar puts
    its minted idempotency key in. ``max_body_bytes`` bounds the request body buffered to
    key and record the effect; ``timeout_s`` bounds how long the agent waits for the
    upstream.  ``settle_s`` is how long the API may keep acting after its client went away
    (SPEC §3.8): the first try's connection is kept that much longer than ``timeout_s`` and
    its answer still recorded, and a probe's "not found" proves absence only once that
    connection has ended and ``settle_s`` more has passed.
    """

    name: str
    description: str | None = None
    match: Annotated[
        Annotated[HttpMatch, Tag("http")] | Annotated[SqlMatch, Tag("sql")],
        Discriminator(_match_kind),
    ]
    effect: EffectKind
    key: TemplateText | None = None  # None: "{name}:{method} {path}#{body hash}"
    idempotency_header: str | None = None
    on_unknown: OnUnknown = OnUnknown.BLOCK
    on_divergence: OnDivergence = OnDivergence.REPLAY
    probe: ProbeSpec | None = None
    exists_when: ExistsWhen | None = None
    protocol: Protocol = Protocol.HTTP
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    timeout_s: float = Field(default=30.0, gt=0, le=600)  # upstream timeout
    settle_s: float = Field(default=30.0, ge=0, le=3600)  # the API acting after we left
    checkpoint: CheckpointSpec | None = None
    redact: Redact = Field(default_factory=Redact)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _RULE_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a rule name: lower-case letters, digits, '.', '_' and '-', "
                "starting with a letter or digit"
            )
        return value

    @field_validator("idempotency_header")
    @classmethod
    def _header(cls, value: str | None) -> str | None:
        if value is not None and not _TOKEN.fullmatch(value):
            raise ValueError(f"{value!r} is not a header name")
        return value

    @property
    def logged(self) -> bool:
        """Whether matching requests go through the effect log (non_idempotent, cache)."""
        return self.effect in (EffectKind.NON_IDEMPOTENT, EffectKind.CACHE)

    @property
    def http(self) -> HttpMatch | None:
        return self.match if isinstance(self.match, HttpMatch) else None

    @property
    def sql(self) -> SqlMatch | None:
        return self.match if isinstance(self.match, SqlMatch) else None

    @model_validator(mode="after")
    def _coherent(self) -> Rule:
        if isinstance(self.match, SqlMatch):
            self._check_sql()
            return self
        if not self.logged:
            for field in ("probe", "idempotency_header", "checkpoint", "redact"):
                if getattr(self, field) not in (None, Redact()):
                    raise FieldProblem(
                        (field,),
                        f"'{field}' is only meaningful for non_idempotent and cache rules; "
                        f"this rule's effect is {self.effect}",
                    )
        if self.protocol is Protocol.GIT_RECEIVE_PACK:
            self._check_git()
        elif self.on_unknown is OnUnknown.PROBE and self.probe is None:
            raise FieldProblem(
                ("on_unknown",), "'on_unknown: probe' needs a 'probe' section saying what to ask"
            )
        if self.exists_when is not None and self.probe is None:
            raise FieldProblem(
                ("exists_when",), "'exists_when' needs a 'probe' to fetch what already exists"
            )
        if self.probe is not None and self.on_unknown is not OnUnknown.PROBE:
            raise FieldProblem(
                ("probe",),
                f"a probe is only used with 'on_unknown: probe' (this rule says "
                f"'on_unknown: {self.on_unknown}')",
            )
        self._check_placeholders()
        self._check_secret_params()
        return self

    def _check_sql(self) -> None:
        if self.effect is EffectKind.CACHE:
            raise FieldProblem(("effect",), "SQL statements are not cached: use non_idempotent")
        if self.redact.anything:
            raise FieldProblem(
                ("redact",), "'redact' is for HTTP rules: their path parameters and answers"
            )
        for field in (
            "key", "probe", "idempotency_header", "exists_when", "checkpoint"
        ):  # fmt: skip
            if getattr(self, field) is not None:
                hint = " (a SQL rule's key goes in match.sql.key)" if field == "key" else ""
                raise FieldProblem(
                    (field,),
                    f"'{field}' does not apply to SQL statements: each is recorded in its own "
                    f"transaction, so its outcome is never unknown{hint}",
                )
        if self.protocol is not Protocol.HTTP:
            raise FieldProblem(("protocol",), "a SQL rule has no HTTP protocol")

    def _check_git(self) -> None:
        if self.effect is not EffectKind.NON_IDEMPOTENT:
            raise FieldProblem(("protocol",), "a git-receive-pack rule is a non_idempotent effect")
        for field in ("probe", "idempotency_header", "exists_when"):
            if getattr(self, field) is not None:
                raise FieldProblem(
                    (field,),
                    f"'{field}' does not apply to git pushes: they are keyed by ref and "
                    "probed through the repository's advertised refs",
                )
        if self.redact.anything:
            raise FieldProblem(
                ("redact",),
                "'redact' does not apply to git pushes: their credentials travel in headers, "
                "which are always redacted, and their answers are a push report",
            )

    def _check_secret_params(self) -> None:
        assert isinstance(self.match, HttpMatch)
        params = self.match.path.params if self.match.path else ()
        for index, name in enumerate(self.redact.params):
            if name not in params:
                known = ", ".join(params) or "none"
                raise FieldProblem(
                    ("redact", "params", index),
                    f"{name!r} is not a parameter of match.path (it has: {known})",
                )

    def _check_placeholders(self) -> None:
        assert isinstance(self.match, HttpMatch)
        params = self.match.path.params if self.match.path else ()
        templates: list[tuple[tuple[str, ...], Template | UrlTemplate]] = []
        if self.key is not None:
            templates.append((("key",), self.key))
        if self.probe is not None:
            request = self.probe.request
            templates.append((("probe", "request", "path"), request.path))
            templates += [
                (("probe", "request", "headers", n), t) for n, t in request.headers.items()
            ]
        for field, template in templates:
            for placeholder in template.placeholders:
                name = placeholder.name
                if placeholder.source is Source.NAME and name not in params + tuple(BUILTINS):
                    known = ", ".join(f"{{{p}}}" for p in params) or "none"
                    raise FieldProblem(
                        field,
                        f"{{{name}}} is not a parameter of match.path (it has: {known}) nor "
                        "one of {method}, {host}, {path}",
                    )


class RuleFile(_Frozen):
    """A whole file: ``rules:`` and, optionally, ``version: 1``."""

    version: Literal[1] = 1
    rules: list[Rule]
