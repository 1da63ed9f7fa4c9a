"""Parsing request bodies: what the quick look at the bytes lets through without the walk
for unstorable values, and that every such value is still refused at the door."""

from __future__ import annotations

import json
import random
import re

import pytest

from sidecar.control.endpoints import parse_body, plainly_storable
from sidecar.control.schemas import CheckpointRequest
from sidecar.errors import InvalidRequest
from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


@pytest.mark.parametrize(
    "raw",
    [
        b'{"attempt_id": "att-1", "generation": 1, "stage": "S", "outputs": {"n": 12}}',
        b'{"n": 922337203685477580}',  # 18 digits: always within 64 bits
        b'{"note": "tab\\t and quote \\" escapes"}',
    ],
)
def test_plain_ascii_bodies_skip_the_walk(raw: bytes) -> None:
    assert plainly_storable(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"note": "\\udc00"}',  # any \\u escape may be a lone surrogate
        b'{"note": "\\u00e9"}',
        '{"note": "é"}'.encode(),  # non-ASCII: json decodes with surrogatepass
        b'{"note": "\xed\xb0\x80"}',  # a surrogate's UTF-8 bytes
        '{"note": "a"}'.encode("utf-16-le"),  # read as UTF-16: NUL bytes
        b'{"n": 9223372036854775808}',  # 19 digits: may be beyond 64 bits
        b'{"n": 1.0000000000000000001}',  # (a float's digits are walked too: harmless)
    ],
)
def test_bodies_that_may_hold_unstorable_values_are_walked(raw: bytes) -> None:
    assert not plainly_storable(raw)


@pytest.mark.parametrize(
    ("outputs", "where"),
    [
        (b'{"big": 9223372036854775808}', ["outputs", "big"]),
        (b'{"big": -9223372036854775809}', ["outputs", "big"]),
        (b'{"raw": "\xed\xb0\x80"}', ["outputs", "raw"]),
        (b'{"list": [1, "\\ud800"]}', ["outputs", "list", 1]),
    ],
)
async def test_unstorable_checkpoint_outputs_are_still_refused(client, outputs, where):
    first = await claim(client)
    body = b'{"attempt_id": "%s", "generation": 1, "stage": "S", "outputs": %s}' % (
        first["attempt_id"].encode(),
        outputs,
    )
    response = await client.post(
        "/v1/tasks/312/checkpoints", data=body, headers={"Content-Type": "application/json"}
    )
    problem = await problem_of(response, 422, "invalid_request")
    assert problem["errors"][0]["loc"] == where
    assert problem["errors"][0]["type"] == "unstorable_value"


async def test_a_utf16_body_with_a_lone_surrogate_is_refused(client):
    first = await claim(client)
    # The surrogate itself, not an escape: json reads UTF-16 with surrogatepass.
    body = {"attempt_id": first["attempt_id"], "generation": 1, "stage": "S"}
    text = json.dumps(body | {"outputs": {"x": "\udc00"}}, ensure_ascii=False)
    response = await client.post(
        "/v1/tasks/312/checkpoints",
        data=text.encode("utf-16", "surrogatepass"),
        headers={"Content-Type": "application/json"},
    )
    problem = await problem_of(response, 422, "invalid_request")
    assert problem["errors"][0]["loc"] == ["outputs", "x"]


async def test_the_largest_64_bit_integers_are_stored(client):
    first = await claim(client)
    body = (
        b'{"attempt_id": "%s", "generation": 1, "stage": "S", '
        b'"outputs": {"max": 9223372036854775807, "min": -9223372036854775808}}'
        % first["attempt_id"].encode()
    )
    response = await client.post(
        "/v1/tasks/312/checkpoints", data=body, headers={"Content-Type": "application/json"}
    )
    assert response.status == 201, await response.text()


class _Body:
    """The one thing parse_body asks of a request."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def read(self) -> bytes:
        return self.raw


@pytest.mark.parametrize(
    "raw",
    [
        b'{"attempt_id": "a", "generation": 1, "stage": "S", "outputs": {"x": [1, {"y": null}]}}',
        b'{"attempt_id": "a", "generation": 1.0, "stage": "S"}',
        b'{"attempt_id": "a", "generation": "1", "stage": "S"}',
        b'{"attempt_id": "a", "generation": true, "stage": "S"}',
        b'{"attempt_id": "a", "generation": 1, "generation": 2, "stage": "S"}',
        b'{"attempt_id": "a", "generation": 1, "stage": "S", "outputs": {"x": 1e400}}',
        b' {"attempt_id": "a", "generation": 1, "stage": "S"}\n',
    ],
)
async def test_the_one_step_parse_reads_bodies_as_json_loads_and_validate_do(raw: bytes) -> None:
    parsed = await parse_body(_Body(raw), CheckpointRequest)  # type: ignore[arg-type]
    assert parsed == CheckpointRequest.model_validate(json.loads(raw))


@pytest.mark.parametrize(
    ("raw", "status", "type_"),
    [
        (b'{"attempt_id": "a", "generation": 1, "stage": "S"', 400, None),  # not JSON
        (b'[{"attempt_id": "a"}]', 422, "object_type"),
        (b'{"attempt_id": "a", "generation": "x", "stage": "S"}', 422, "int_parsing"),
        (b'{"attempt_id": "a", "generation": 1, "stage": "S", "extra": 1}', 422, "extra_forbidden"),
        (b'{"attempt_id": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None),
    ],
)
async def test_bodies_the_one_step_parse_refuses_get_the_full_answer(raw, status, type_) -> None:
    with pytest.raises(InvalidRequest) as refused:
        await parse_body(_Body(raw), CheckpointRequest)  # type: ignore[arg-type]
    assert refused.value.status == status
    if type_ is not None:
        assert [e["type"] for e in refused.value.errors or []] == [type_]


def _plainly_storable_by_regex(raw: bytes) -> bool:
    """plainly_storable as it was before it counted the digits first: the reference."""
    return (
        raw.isascii()
        and b"\\u" not in raw
        and b"\x00" not in raw
        and re.search(rb"[0-9]{19}", raw) is None
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{}",
        b'{"n": 1234567890123456789}',  # 19 in a row
        b'{"n": 123456789012345678}',  # 18 in a row
        b'{"a": 1234567890, "b": 123456789}',  # 19 in all, never 19 in a row
        b'{"a": 12345678901234567890123, "b": 1}',
        b'{"a": "' + b"1" * 18 + b'", "b": "' + b"2" * 18 + b'"}',
        b'{"a": "' + b"1" * 19 + b'"}',
        b'{"s": "\\u00e9"}',
        '{"s": "é"}'.encode(),
        b'{"s": "\x00"}',
        b'{"attempt_id": "01KBFJ7X0SSFG2Q7TJ1C4Z5HWE", "generation": 1, "outputs": {"n": 7}}',
        b"9" * 19,
        b"9" * 18 + b"x" + b"9" * 18,
    ],
)
def test_counting_digits_first_decides_as_the_regex_alone(raw: bytes) -> None:
    assert plainly_storable(raw) == _plainly_storable_by_regex(raw)


def test_counting_digits_first_decides_as_the_regex_alone_on_random_bodies() -> None:
    rng = random.Random(18)
    for _ in range(3000):
        raw = bytes(rng.choice(b'0123456789 ,:{}"ab') for _ in range(rng.randrange(0, 80)))
        assert plainly_storable(raw) == _plainly_storable_by_regex(raw), raw
