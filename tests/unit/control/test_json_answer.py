"""json_answer writes the serializer's bytes itself: the same body and Content-Type as
``Response(text=model.model_dump_json(), content_type="application/json")`` did."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiohttp import web

from sidecar.control.endpoints import json_answer
from sidecar.control.schemas import CheckpointCreated, Health

ANSWERS = [
    CheckpointCreated(
        task="t-é✓", seq=7, stage="READ", generation=3, created_at=datetime(2024, 5, 1, tzinfo=UTC)
    ),
    CheckpointCreated(
        task="t", seq=1, stage="S", generation=1, created_at=datetime(2024, 5, 1, 1, 2, 3, 456789)
    ),
]


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("status", [200, 201])
def test_json_answer_is_what_model_dump_json_answered(answer: CheckpointCreated, status: int):
    before = web.Response(
        status=status, text=answer.model_dump_json(), content_type="application/json"
    )
    now = json_answer(answer, status)
    assert now.body == before.body
    assert now.status == before.status
    assert now.headers["Content-Type"] == before.headers["Content-Type"]
    assert now.headers["Content-Type"] == "application/json; charset=utf-8"


def test_json_answer_of_a_model_not_built_yet():
    """Response models build on first use (defer_build): the first answer is right too."""
    answer = Health.model_construct(**{name: "ok" for name in Health.model_fields})
    assert json_answer(answer).body == answer.model_dump_json().encode()
