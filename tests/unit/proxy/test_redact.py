"""Redacting what a rule marks: secrets in a URL, fields of a recorded answer."""

from __future__ import annotations

import gzip
import hashlib
import json

from sidecar.domain.model import RecordedResponse
from sidecar.proxy.redact import (
    MAX_BODY_EXCERPT,
    OFF_LOOP_BYTES,
    REDACTED,
    UNREADABLE_BODY_HEADER,
    body_digest_off_loop,
    redact_response,
    request_summary,
    without_secrets,
)

JSON = (("Content-Type", "application/json"),)


def answer(body: object, headers=JSON, raw: bytes | None = None) -> RecordedResponse:
    return RecordedResponse(201, tuple(headers), json.dumps(body).encode() if raw is None else raw)


def test_a_secret_is_taken_out_of_any_text_as_sent_and_percent_decoded():
    text = "POST https://x.test/bot1%3Aab/send: reset; token 1:ab"
    assert (
        without_secrets(text, ["1%3Aab"])
        == f"POST https://x.test/bot{REDACTED}/send: reset; token {REDACTED}"
    )
    assert without_secrets(text, []) == text


def test_named_fields_are_redacted_at_the_top_nested_and_in_every_list_item():
    body = {
        "client_secret": "s",
        "credentials": {"password": "p", "user": "u"},
        "keys": [{"private": "k1"}, {"private": "k2", "id": 2}],
    }
    fields = [("client_secret",), ("credentials", "password"), ("keys", "private")]
    kept = redact_response(answer(body), fields)
    assert json.loads(kept.body) == {
        "client_secret": REDACTED,
        "credentials": {"password": REDACTED, "user": "u"},
        "keys": [{"private": REDACTED}, {"private": REDACTED, "id": 2}],
    }
    assert kept.status == 201
    assert kept.headers == JSON


def test_a_top_level_list_answer_is_stepped_into():
    kept = redact_response(answer([{"token": "t1"}, {"token": "t2"}]), [("token",)])
    assert json.loads(kept.body) == [{"token": REDACTED}, {"token": REDACTED}]


def test_an_answer_without_the_fields_is_kept_byte_for_byte():
    original = answer({}, raw=b'{ "id": 1,  "name": "x" }')
    assert redact_response(original, [("client_secret",)]) is original
    assert redact_response(original, []) is original


def test_a_compressed_answer_is_stored_decoded_and_redacted():
    raw = gzip.compress(json.dumps({"client_secret": "s", "id": 1}).encode())
    compressed = answer({}, headers=(*JSON, ("Content-Encoding", "gzip")), raw=raw)
    kept = redact_response(compressed, [("client_secret",)])
    assert json.loads(kept.body) == {"client_secret": REDACTED, "id": 1}
    assert kept.headers == JSON


def test_a_form_encoded_answer_is_redacted_by_top_level_name():
    form = (("Content-Type", "application/x-www-form-urlencoded"),)
    raw = b"access_token=gho_abc&scope=repo&token_type=bearer"
    kept = redact_response(answer({}, headers=form, raw=raw), [("access_token",)])
    assert kept.body == b"access_token=%5Bredacted%5D&scope=repo&token_type=bearer"


def test_an_answer_whose_fields_cannot_be_read_is_not_kept():
    html = (("Content-Type", "text/html"),)
    kept = redact_response(answer({}, headers=html, raw=b"<p>secret: s</p>"), [("secret",)])
    assert kept.body == b""
    assert kept.headers == (*html, UNREADABLE_BODY_HEADER)
    garbled = answer({}, headers=(*JSON, ("Content-Encoding", "gzip")), raw=b"not gzip")
    assert redact_response(garbled, [("secret",)]).body == b""


def test_a_large_body_keeps_a_redacted_excerpt_without_its_secrets():
    items = [{"id": i, "password": f"pw-{i}", "note": "n" * 40} for i in range(20_000)]
    body = json.dumps({"items": items}).encode()
    summary = request_summary("POST", "https", "h", "/p", "", [], body)
    excerpt = summary["body"]
    assert excerpt.endswith("...")
    assert len(excerpt) == MAX_BODY_EXCERPT + 3
    assert '"password":"[redacted]"' in excerpt
    assert "pw-" not in excerpt
    assert summary["body_bytes"] == len(body)


def test_a_long_string_cut_in_the_middle_of_a_token_shows_no_part_of_it():
    token = "ghp_" + "A1b2" * 10
    text = "w " * (MAX_BODY_EXCERPT // 2 - 10) + token + " tail" * 1000
    summary = request_summary("POST", "https", "h", "/p", "", [], json.dumps([text]).encode())
    assert "ghp_" not in summary["body"]
    assert "A1b2" not in summary["body"]


def test_a_small_body_is_kept_as_parsed_redacted_json():
    body = b'{"name": "x", "api_key": "k", "nested": [{"token": "t", "n": 1}]}'
    summary = request_summary("POST", "https", "h", "/p", "", [], body)
    assert summary["body"] == {
        "name": "x",
        "api_key": "[redacted]",
        "nested": [{"token": "[redacted]", "n": 1}],
    }


def test_a_summary_takes_the_digest_it_is_given_and_makes_one_otherwise():
    body = b'{"a": 1}'
    made = request_summary("POST", "https", "h", "/p", "", [], body)
    assert made["body_sha256"] == hashlib.sha256(body).hexdigest()
    given = request_summary("POST", "https", "h", "/p", "", [], body, body_sha256="d" * 64)
    assert given["body_sha256"] == "d" * 64


async def test_only_a_large_body_is_hashed_on_a_worker_thread():
    assert body_digest_off_loop(b"x" * (OFF_LOOP_BYTES - 1)) is None
    large = b"y" * OFF_LOOP_BYTES
    digest = body_digest_off_loop(large)
    assert digest is not None
    assert await digest == hashlib.sha256(large).hexdigest()
