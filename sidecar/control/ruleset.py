"""Routes of the sidecar's loaded rules: what they are, and what one request would be.

``GET /v1/rules`` lists the rules the running sidecar matches with, in matching order,
each with where it was written (``FILE:LINE``) and its definition as the YAML gave it.
``POST /v1/rules/explain`` answers ``sidecar rules explain`` for one HTTP request or one
SQL text, against those same rules: the rule that wins, the ones it shadows, the effect
key, the idempotency key it would send, the probe an unknown outcome would send.  Both
read only what is loaded; neither touches the store or the network.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Self

from aiohttp import web
from pydantic import Field, JsonValue, model_validator

from sidecar.control.endpoints import Api, json_answer, parse_body
from sidecar.control.keys import RULES
from sidecar.control.schemas import Request, Response
from sidecar.errors import InvalidRequest
from sidecar.rules import HttpRequestFacts, RuleSet
from sidecar.rules.explain import explain_http, explain_sql

api = Api("rules")
_PROBLEMS = ("invalid_request", "unauthorized")

HeaderName = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
]
HeaderValue = Annotated[str, Field(max_length=8192, pattern=r"^[^\r\n\x00]*$")]


class RuleOut(Response):
    name: str
    at: str = Field(description="FILE:LINE where the rule is written.")
    effect: str = Field(description="read, idempotent, non_idempotent or cache.")
    on_unknown: str
    timeout_s: float
    settle_s: float
    probe: bool = Field(description="Whether an unknown outcome is checked by a probe.")
    definition: dict[str, JsonValue] = Field(
        description="The rule as written (fields left at their defaults omitted)."
    )


class RuleList(Response):
    files: list[str]
    rules: list[RuleOut] = Field(description="In matching order: the first match wins.")


class ExplainRequest(Request):
    """One HTTP request (``method`` and an absolute ``url``) or one SQL text (``sql``)."""

    method: str | None = Field(
        default=None, pattern=r"^[A-Za-z]{1,16}$", examples=["POST"], description="HTTP method."
    )
    url: str | None = Field(
        default=None,
        max_length=8192,
        pattern=r"^https?://[^\s]+$",
        examples=["https://api.github.com/repos/acme/app/pulls"],
    )
    headers: dict[HeaderName, HeaderValue] = Field(default_factory=dict)
    body: JsonValue = Field(
        default=None,
        description="The request body: a string is sent as that text, any other JSON "
        "value as JSON (with Content-Type application/json unless a header says else).",
    )
    sql: str | None = Field(default=None, min_length=1, max_length=65536)
    params: list[str | None] = Field(
        default_factory=list, max_length=256, description="Bind parameters $1, $2, ... of sql."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        http = self.method is not None or self.url is not None
        if self.sql is not None and http:
            raise ValueError("give either method and url, or sql, not both")
        if self.sql is None and (self.method is None or self.url is None):
            raise ValueError("give method and url (an HTTP request), or sql")
        return self


class Explanation(Response):
    http: dict[str, JsonValue] | None = Field(
        default=None, description="As `sidecar rules explain METHOD URL --json` prints it."
    )
    sql: dict[str, JsonValue] | None = Field(
        default=None, description="As `sidecar rules explain --sql TEXT --json` prints it."
    )


def _loaded(request: web.Request) -> RuleSet:
    return request.app.get(RULES) or RuleSet()


def _listing(rules: RuleSet) -> RuleList:
    out = []
    for rule in rules:
        source = rules.sources.get(rule.name)
        out.append(
            RuleOut(
                name=rule.name,
                at=f"{source.file}:{source.line}" if source else "",
                effect=rule.effect.value,
                on_unknown=rule.on_unknown.value,
                timeout_s=rule.timeout_s,
                settle_s=rule.settle_s,
                probe=rule.probe is not None,
                definition=rule.model_dump(mode="json", exclude_defaults=True),
            )
        )
    return RuleList(files=[str(f) for f in rules.files], rules=out)


@api.route(
    "GET",
    "/v1/rules",
    summary="The loaded rules in matching order, each with FILE:LINE and its definition.",
    answer=RuleList,
    problems=("unauthorized",),
)
async def list_rules(request: web.Request) -> web.Response:
    return json_answer(_listing(_loaded(request)))


def _facts(asked: ExplainRequest) -> HttpRequestFacts:
    assert asked.method is not None
    assert asked.url is not None
    headers = list(asked.headers.items())
    raw: bytes | None = None
    if asked.body is not None:
        if isinstance(asked.body, str):
            raw = asked.body.encode()
        else:
            raw = json.dumps(asked.body, separators=(",", ":")).encode()
            if not any(n.lower() == "content-type" for n, _ in headers):
                headers.append(("Content-Type", "application/json"))
    return HttpRequestFacts.from_url(asked.method.upper(), asked.url, headers, raw)


def _explain(rules: RuleSet, asked: ExplainRequest) -> Explanation:
    if asked.sql is not None:
        params = tuple(None if p is None else p.encode() for p in asked.params)
        found: dict[str, Any] = explain_sql(rules, asked.sql, params)
        return Explanation(sql=found)
    return Explanation(http=explain_http(rules, _facts(asked)))


@api.route(
    "POST",
    "/v1/rules/explain",
    summary="What the sidecar would do with one HTTP request or SQL text (as `sidecar rules "
    "explain`): the rule, the shadowed rules, the effect key, the idempotency key, the "
    "probe. Sends nothing, records nothing.",
    body=ExplainRequest,
    answer=Explanation,
    problems=_PROBLEMS,
)
async def explain(request: web.Request) -> web.Response:
    asked = await parse_body(request, ExplainRequest)
    try:
        # SQL is parsed by libpg_query: off the event loop the proxy shares.
        answer = await asyncio.to_thread(_explain, _loaded(request), asked)
    except ValueError as exc:
        raise InvalidRequest(f"cannot explain this request: {exc}") from exc
    return json_answer(answer)
