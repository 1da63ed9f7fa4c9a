"""The release route takes how the attempt's agent ended; the task shows it per attempt."""

from __future__ import annotations

import pytest

from tests.unit.conftest import claim


async def _attempts(client) -> list[dict]:
    response = await client.get("/v1/tasks/312")
    assert response.status == 200, await response.text()
    return (await response.json())["attempts"]


@pytest.mark.parametrize(
    ("end", "how"),
    [
        ({"exit_code": 3}, "exit 3"),
        ({"signal": "SIGKILL"}, "killed by SIGKILL"),
        ({"exit_code": 127, "error": "command not found"}, "command not found (127)"),
    ],
)
async def test_release_keeps_the_end_and_the_task_shows_it(client, end, how):
    first = await claim(client)
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    response = await client.post("/v1/tasks/312/release", json=token | {"end": end})
    assert response.status == 200, await response.text()
    [attempt] = await _attempts(client)
    assert attempt["end_reason"] == "released"
    assert attempt["how"] == how
    assert attempt["exit"] == {
        "exit_code": end.get("exit_code"),
        "signal": end.get("signal"),
        "error": end.get("error"),
        "lease_lost": False,
    }


async def test_a_lost_lease_is_recorded_while_the_release_is_refused(client):
    first = await claim(client)
    await claim(client)  # the same worker claims again: the first attempt is superseded
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    end = {"signal": "SIGTERM", "lease_lost": True}
    response = await client.post("/v1/tasks/312/release", json=token | {"end": end})
    assert response.status == 409
    assert (await response.json())["code"] == "stale_generation"
    old, new = await _attempts(client)
    assert (old["end_reason"], old["how"]) == ("superseded", "lease lost")
    assert (new["how"], new["exit"]) == ("current", None)


@pytest.mark.parametrize(
    "end",
    [
        {},
        {"exit_code": 3, "signal": "SIGKILL"},
        {"exit_code": 256},
        {"exit_code": "3"},
        {"signal": "KILL"},
        {"signal": "SIGKILL", "error": "command not found"},
        {"exit_code": 1, "why": "typo"},
    ],
)
async def test_a_malformed_end_is_refused_and_nothing_is_released(client, end):
    first = await claim(client)
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    response = await client.post("/v1/tasks/312/release", json=token | {"end": end})
    assert response.status == 422, await response.text()
    assert (await response.json())["code"] == "invalid_request"
    [attempt] = await _attempts(client)
    assert attempt["how"] == "current"


async def test_the_openapi_document_describes_the_end(client):
    document = await (await client.get("/openapi.json")).json()
    text = str(document)
    assert "lease_lost" in text
    assert "killed by SIGKILL" in text
