"""Declaring routes once: for aiohttp's router and for ``/openapi.json``.

Each resource module owns an :class:`Api`; its ``@api.route(...)`` decorator registers
the handler and remembers the body model, answer model and problem codes, from which
:mod:`sidecar.control.openapi` writes the document.  Bodies are parsed here too, so
every route rejects malformed JSON and unknown fields the same way.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import BaseModel, TypeAdapter, ValidationError

from sidecar.domain.ids import TASK_PATTERN
from sidecar.domain.text import unstorable
from sidecar.errors import InvalidRequest

type Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: What a route that reads or writes the store may answer besides its own problems.
STORE_PROBLEMS = ("invalid_request", "store_unavailable", "unauthorized")
#: ... and a route about one task, which must exist.
TASK_PROBLEMS = ("not_found", *STORE_PROBLEMS)

_TASK = re.compile(TASK_PATTERN)
# 19 digits in a row: the shortest integer literal that can lie beyond 64 bits.
_LONG = 19
_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % _LONG)
_DIGITS = b"0123456789"


def plainly_storable(raw: bytes) -> bool:
    """Whether the JSON text ``raw`` cannot hold anything :func:`unstorable` refuses, seen
    from its bytes alone (False: walk the parsed value to find out).

    A lone surrogate can only come from a ``\\u`` escape, from non-ASCII bytes (json
    decodes UTF-8 with ``surrogatepass``) or from a body json reads as UTF-16/32 (which
    has NUL bytes); an integer beyond 64 bits needs 19 digits.  Most bodies are short
    ASCII with none of these, and this look costs a fraction of the walk, which showed
    up in every checkpoint's CPU time (bench/control_api.py).
    """
    # find() rather than ``in``: the same C search, but ``in`` on bytes first tries its
    # operand as an integer (a TypeError raised and cleared), four times find()'s cost.
    return (
        raw.isascii()
        and raw.find(b"\\u") < 0
        and raw.find(b"\x00") < 0
        # 19 digits in a row need 19 digits in all: counted first (deleting the digits
        # is a single C pass, a quarter of the regex search), which most bodies lack.
        and (
            len(raw) - len(raw.translate(None, _DIGITS)) < _LONG or _LONG_DIGITS.search(raw) is None
        )
    )


#: An answer's model, or where it is defined (``"package.module:Name"``): a route an
#: operator calls now and then (the review, the resume check) then imports its module
#: when it first runs or the OpenAPI document is made, not with every sidecar.
type ModelRef = type[BaseModel] | str


@dataclass(frozen=True, slots=True)
class Endpoint:
    method: str
    path: str
    summary: str
    handler_name: str
    body: type[BaseModel] | None
    status: int
    answer: ModelRef | None
    content_type: str
    problems: tuple[str, ...]
    tag: str
    paginated: bool = False

    @property
    def answer_model(self) -> type[BaseModel] | None:
        if self.answer is None or isinstance(self.answer, type):
            return self.answer
        module, _, name = self.answer.partition(":")
        model: type[BaseModel] = getattr(importlib.import_module(module), name)
        return model


@dataclass
class Api:
    tag: str
    routes: web.RouteTableDef = field(default_factory=web.RouteTableDef)
    endpoints: list[Endpoint] = field(default_factory=list)

    def route(
        self,
        method: str,
        path: str,
        *,
        summary: str,
        body: type[BaseModel] | None = None,
        status: int = 200,
        answer: ModelRef | None = None,
        content_type: str = "application/json",
        problems: tuple[str, ...] = (),
        paginated: bool = False,
    ) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.routes.route(method, path)(handler)
            self.endpoints.append(
                Endpoint(
                    method=method.lower(),
                    path=re.sub(r"{(\w+):[^}]+}", r"{\1}", path),  # documented: no regex
                    summary=summary,
                    handler_name=handler.__name__,
                    body=body,
                    status=status,
                    answer=answer,
                    content_type=content_type,
                    problems=problems,
                    tag=self.tag,
                    paginated=paginated,
                )
            )
            return handler

        return register


# model -> its TypeAdapter: validate_json through one costs less per call than the
# model's own model_validate_json wrapper (callgrind), and is built once per model.
_ADAPTERS: dict[type[BaseModel], TypeAdapter[Any]] = {}


def _adapter[M: BaseModel](model: type[M]) -> TypeAdapter[M]:
    adapter = _ADAPTERS.get(model)
    if adapter is None:
        adapter = _ADAPTERS[model] = TypeAdapter(model)
    return adapter


async def parse_body[M: BaseModel](request: web.Request, model: type[M]) -> M:
    """The request's JSON body as ``model``; 400 if it is not JSON, 422 if it does not fit."""
    raw = await request.read()
    if plainly_storable(raw):
        # The common case in one step: pydantic parses and validates the bytes (one
        # call instead of json.loads and a walk of the dict).  A body it refuses takes
        # the steps below, which say what is wrong exactly as they always did.
        try:
            return _adapter(model).validate_json(raw)
        except ValidationError:
            pass
    try:
        data = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # json.loads recurses once per level of nesting
        raise InvalidRequest("the body is nested too deeply to be a request") from exc
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"the body must be a JSON object, got {type(data).__name__}",
            errors=[{"loc": [], "msg": "expected a JSON object", "type": "object_type"}],
        )
    try:
        problem = unstorable(data)
    except RecursionError as exc:
        raise InvalidRequest("the body is nested too deeply to be a request") from exc
    if problem is not None:
        # Refused here, before it could be committed and break every later read.
        where, what = problem
        raise InvalidRequest(
            f"the body holds a value the store cannot hold: {what}",
            errors=[{"loc": list(where), "msg": what, "type": "unstorable_value"}],
        )
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]
        raise InvalidRequest(
            f"the body does not match {model.__name__}: {len(errors)} problem(s)", errors=errors
        ) from exc


def task_param(request: web.Request) -> str:
    task = request.match_info["task"]
    if not _TASK.fullmatch(task):  # (match() would take a trailing newline at '$')
        raise InvalidRequest(
            f"invalid task id {task!r}: 1-128 characters of letters, digits and ._:@-"
        )
    return task


def json_answer(model: BaseModel, status: int = 200) -> web.Response:
    """``model`` as the JSON answer, ``application/json; charset=utf-8``."""
    # The model's serializer straight to bytes: model_dump_json() wraps this very call in
    # argument handling and a decode, which Response(text=...) then encoded again - a
    # quarter of what an answer cost (callgrind).  Same bytes, same header.
    body = type(model).__pydantic_serializer__.to_json(model)
    return web.Response(status=status, body=body, content_type="application/json", charset="utf-8")
