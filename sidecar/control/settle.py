"""``POST /v1/tasks/{task}/effects/{effect_key}/resolve``: a human settles an effect.

The effect key goes in the path percent-encoded (keys hold ``/``, ``#``, ``:`` and
spaces: ``acme%2Fapp%23pull%3Aagent``); aiohttp decodes it once, and a ``/`` left
unencoded works too, since the key runs up to the final ``/resolve``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from aiohttp import web
from pydantic import Field, JsonValue, model_validator

from sidecar.control.endpoints import TASK_PROBLEMS, Api, json_answer, parse_body, task_param
from sidecar.control.keys import RULES, STORE
from sidecar.control.schemas import EffectOut, Request, Response
from sidecar.domain import settling
from sidecar.domain.text import text_problem
from sidecar.errors import InvalidRequest
from sidecar.store.settle import landing_of, resolve_effect

api = Api("effects")

HeaderName = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
]
HeaderValue = Annotated[str, Field(max_length=8192, pattern=r"^[^\r\n\x00]*$")]


class EvidenceIn(Request):
    """The answer the human found in the outside world, as later attempts get it."""

    status: int = Field(ge=100, le=599, strict=True, examples=[201])
    headers: dict[HeaderName, HeaderValue] = Field(
        default_factory=dict, description="Response headers (framing headers are dropped)."
    )
    body: JsonValue = Field(
        default=None,
        description="A string is answered as that text (text/plain unless a Content-Type "
        "is given); any other JSON value as JSON (application/json); null: no body.",
    )


class ResolveRequest(Request):
    outcome: Literal["completed", "failed", "abandoned"] = Field(
        description="completed: it happened (answer later attempts with `response`); "
        "failed: it did not (the next attempt sends it again, with the first idempotency "
        "key); abandoned: it must not (later attempts get 409 effect_abandoned)."
    )
    response: EvidenceIn | None = Field(
        default=None,
        description="Only with completed, and required for it except for a git push "
        "(answered from its own refs).",
    )
    note: str = Field(min_length=1, max_length=4096, description="Why: what the human found.")
    by: str = Field(min_length=1, max_length=256, description="Who resolved it.")

    @model_validator(mode="after")
    def _response_only_when_completed(self) -> Self:
        if self.response is not None and self.outcome != "completed":
            raise ValueError(f"response is only for outcome completed, not {self.outcome}")
        if not self.note.strip() or not self.by.strip():
            raise ValueError("note and by must not be blank")
        for name, text in (("note", self.note), ("by", self.by)):
            if (why := text_problem(text)) is not None:
                raise ValueError(f"{name}: {why}")
        return self


class ResolveOut(Response):
    task: str
    effect_key: str
    outcome: str
    state: str = Field(description="The effect's state now (abandoned is kept as failed).")
    by: str
    note: str
    effect: EffectOut


@api.route(
    "POST",
    "/v1/tasks/{task}/effects/{effect_key:.+}/resolve",
    summary="A human settles an effect that waits for one (unknown outcome, CANNOT "
    "DETERMINE): completed with the evidence found, failed, or abandoned; audited.",
    body=ResolveRequest,
    answer=ResolveOut,
    problems=("not_waiting_for_a_human", *TASK_PROBLEMS),
)
async def resolve(request: web.Request) -> web.Response:
    task = task_param(request)
    key = request.match_info["effect_key"]
    if (why := text_problem(key)) is not None:
        raise InvalidRequest(f"invalid effect key {key!r}: {why}")
    body = await parse_body(request, ResolveRequest)
    given = body.response
    resolution = settling.Resolution(
        outcome=settling.Outcome(body.outcome),
        by=body.by.strip(),
        note=body.note.strip(),
        response=None
        if given is None
        else settling.evidence(given.status, given.headers, given.body),
    )
    store = request.app[STORE]
    effect = await resolve_effect(store, task, key, resolution, landing_of(request.app.get(RULES)))
    events = await store.effect_events_of([(task, key)])
    answer = ResolveOut(
        task=task,
        effect_key=key,
        outcome=body.outcome,
        state=effect.state.value,
        by=resolution.by,
        note=resolution.note,
        effect=EffectOut.of(effect, events),
    )
    return json_answer(answer)
