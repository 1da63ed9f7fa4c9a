"""Writing the OpenAPI 3.1 document from the declared endpoints and pydantic models."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

import sidecar
from sidecar.control.endpoints import Endpoint
from sidecar.control.pages import QUERY_PARAMETERS
from sidecar.control.schemas import Problem
from sidecar.domain.ids import TASK_PATTERN
from sidecar.errors import InvalidRequest, SidecarError
from sidecar.runtime.problems import PROBLEM_JSON

_REF = "#/components/schemas/{model}"


def _problem_statuses() -> dict[str, int]:
    """Each problem code's HTTP status, as its error class says; ``invalid_request`` is
    documented as the 422 of a body that breaks its schema (its 400 is added apart)."""
    found: dict[str, int] = {}
    classes: list[type[SidecarError]] = [SidecarError]
    while classes:
        cls = classes.pop()
        found.setdefault(cls.code, cls.status)
        classes.extend(cls.__subclasses__())
    return found | {InvalidRequest.code: 422}


def build(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    endpoints = list(endpoints)
    statuses = _problem_statuses()
    models: set[type[BaseModel]] = {Problem}
    for e in endpoints:
        models.update(m for m in (e.body, e.answer_model) if m is not None)
    modes: list[tuple[type[BaseModel], Any]] = []
    for model in sorted(models, key=lambda m: m.__name__):
        is_request = any(e.body is model for e in endpoints)
        modes.append((model, "validation" if is_request else "serialization"))
    keys, defs = models_json_schema(modes, ref_template=_REF)
    schemas = defs.get("$defs", {})

    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        operation: dict[str, Any] = {
            "operationId": e.handler_name,
            "summary": e.summary,
            "tags": [e.tag],
            "responses": {str(e.status): _answer(e, keys)},
        }
        params = re.findall(r"{(\w+)}", e.path)
        if params:
            operation["parameters"] = [
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "pattern": TASK_PATTERN}
                    if name == "task"
                    else {"type": "string", "description": "percent-encoded"},
                }
                for name in params
            ]
        if e.paginated:
            operation.setdefault("parameters", []).extend(QUERY_PARAMETERS)
        if e.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": keys[(e.body, "validation")]}},
            }
        for code in e.problems:
            status = str(statuses.get(code, 400))
            entry = operation["responses"].setdefault(
                status,
                {
                    "description": "",
                    "content": {PROBLEM_JSON: {"schema": {"$ref": _REF.format(model="Problem")}}},
                },
            )
            entry["description"] = ", ".join(filter(None, [entry["description"], code]))
        if "invalid_request" in e.problems:
            operation["responses"].setdefault(
                "400",
                {
                    "description": "invalid_request (body is not JSON)",
                    "content": {PROBLEM_JSON: {"schema": {"$ref": _REF.format(model="Problem")}}},
                },
            )
        paths.setdefault(e.path, {})[e.method] = operation

    return {
        "openapi": "3.1.0",
        "info": {
            "title": "effect-sidecar control API",
            "version": sidecar.__version__,
            "description": "Claim leases with fencing generations, stage checkpoints and the "
            "effect audit trail. Errors are RFC 9457 problem+json with a stable `code`.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


def _answer(e: Endpoint, keys: dict[Any, Any]) -> dict[str, Any]:
    model = e.answer_model
    if model is None:
        return {"description": e.summary, "content": {e.content_type: {"schema": {}}}}
    return {
        "description": e.summary,
        "content": {e.content_type: {"schema": keys[(model, "serialization")]}},
    }
