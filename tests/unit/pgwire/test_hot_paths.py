"""The per-statement paths made cheap keep doing what they did: the sidecar's own requests
built in one go, their answers handed over a batch at a time, the error looked for in one
pass, the password first look, and the agent's side read on while the engine runs a
statement (paused only if the agent says more; its end seen once the engine is done), the
first look at each query, and the framing's spans."""

from __future__ import annotations

import asyncio
import itertools
import re
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.pgwire import messages, records, redaction
from sidecar.pgwire.codec import FrontendReader, Message, spans
from sidecar.pgwire.exactly_once import _FirstLook
from sidecar.pgwire.records import Refused, Skipped
from sidecar.pgwire.session import SKIPPED, Conversation, Portal, _ClientSide
from sidecar.pgwire.tracker import Tracker


def _frame(kind: bytes, body: bytes) -> bytes:
    """A protocol message as the PostgreSQL docs lay it out: type, Int32 length, body."""
    return kind + (len(body) + 4).to_bytes(4, "big") + body


@pytest.mark.parametrize("sync", [True, False])
def test_a_request_is_parse_bind_execute_and_both_closes_in_wire_bytes(
    monkeypatch: pytest.MonkeyPatch, sync: bool
) -> None:
    monkeypatch.setattr(records, "_names", itertools.count(41))
    name = b"__effect_sidecar_41\0"
    built = records.request("SELECT $1, $2", ["é", ""], sync=sync)
    assert built == [
        _frame(b"P", name + b"SELECT $1, $2\0" + b"\0\0"),  # no parameter types
        _frame(
            b"B",
            name
            + name
            + b"\0\0"  # portal, statement, no format codes (all text)
            + b"\0\2"
            + b"\0\0\0\2"
            + "é".encode()
            + b"\0\0\0\0"  # two values
            + b"\0\0",  # results in text
        ),
        _frame(b"E", name + b"\0\0\0\0"),  # every row
        _frame(b"C", b"P" + name),
        _frame(b"C", b"S" + name),
        _frame(b"S" if sync else b"H", b""),
    ]


def test_a_null_parameter_is_bound_with_length_minus_one() -> None:
    bound = messages.bind_message("p", "s", [None, b"x"])
    assert bound == _frame(b"B", b"p\0s\0\0\0\0\2" + b"\xff\xff\xff\xff" + b"\0\0\0\1x" + b"\0\0")


def _m(kind: bytes, raw: bytes = b"") -> Message:
    return Message(kind, b"", raw)


def test_a_skipped_request_is_skipped_wherever_the_skip_shows() -> None:
    failed = Message(b"E", None, messages.error_response("42P01", "no table"))
    with pytest.raises(Skipped):
        records.raise_on_error([failed, _m(SKIPPED)], "what")


def test_the_first_error_is_the_refusal() -> None:
    first = Message(b"E", None, messages.error_response("42P01", "first"))
    second = Message(b"E", None, messages.error_response("23505", "second"))
    with pytest.raises(Refused, match="42P01 first"):
        records.raise_on_error([_m(b"1"), first, second], "what")
    records.raise_on_error([_m(b"1"), _m(b"C"), _m(b"Z")], "what")  # no error: nothing


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO t VALUES (1)",
        "ALTER ROLE app PASSWORD 'x'",
        "alter role app PassWord 'x'",
        "CREATE SUBSCRIPTION s CONNECTION 'host=h' PUBLICATION p",
        "ALTER ROLE app PA\u017f\u017fWORD 'x'",  # long s: Unicode case rules make it an s
        "SELECT 'é'",
        "SELECT 'conneCTIONé'",
    ],
)
def test_the_password_first_look_agrees_with_the_regex(sql: str) -> None:
    assert redaction._may_hold_password(sql) == bool(redaction._MAYBE.search(sql))


def test_sent_ours_queues_as_sent_does() -> None:
    parts = records.request(records.RECORD, ["t", "k", "a", "1", "x"], sync=False)
    one, many = Tracker(), Tracker()
    for raw in parts:
        one.sent(raw[:1], ours=True)
    assert many.sent_ours(tuple(parts))
    assert list(many.queue) == list(one.queue)
    assert many.ours_owed == one.ours_owed
    assert not Tracker().sent_ours((messages.FLUSH,))  # a Flush alone is never answered


class _Writer:
    """A StreamWriter as the session uses it: written to, drained."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.transport = self

    def write(self, data: bytes) -> None:
        self.written += data

    async def drain(self) -> None:
        return None

    def get_write_buffer_size(self) -> int:
        return 0


async def test_answers_come_a_batch_at_a_time() -> None:
    conversation = Conversation(cast(Any, _Writer()), cast(Any, _Writer()), Tracker())
    conversation.ours.add(_m(b"1"), False)
    conversation.ours.add(_m(b"Z"), True)
    conversation.ours.add(_m(b"C"), False)  # the next batch, not whole yet
    assert [a.kind for a in await conversation.answers(True)] == [b"1", b"Z"]
    waiting = asyncio.ensure_future(conversation.answers(True))
    await asyncio.sleep(0)
    assert not waiting.done()
    conversation.ours.add(_m(b"Z"), True)
    assert [a.kind for a in await waiting] == [b"C", b"Z"]
    assert await conversation.answers(False) == []


async def test_the_server_gone_ends_a_batch_with_an_error() -> None:
    conversation = Conversation(cast(Any, _Writer()), cast(Any, _Writer()), Tracker())
    conversation.ours.add(_m(b"1"), False)
    conversation.ours.add(Message(b"", b"", b""), True)
    with pytest.raises(ConnectionError):
        await conversation.answers(True)


class _Transport:
    """The agent's side of the connection as the client side drives it."""

    def __init__(self) -> None:
        self.paused = False
        self.pauses = 0
        self.closed = False

    def get_protocol(self) -> _Transport:
        return self

    def pause_reading(self) -> None:
        self.paused = True
        self.pauses += 1

    def resume_reading(self) -> None:
        self.paused = False

    def is_reading(self) -> bool:
        return not self.paused

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def connection_lost(self, exc: Exception | None) -> None:
        return None


class _Engine:
    """Guards every query; runs one until told to go on."""

    def __init__(self) -> None:
        self.go_on = asyncio.Event()
        self.ran: list[str] = []

    def might_guard(self, sql: bytes) -> bool:
        return True

    def guards(self, sql: str) -> bool:
        return True

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        self.ran.append(sql)
        await self.go_on.wait()

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        raise AssertionError("no extended protocol here")

    def ready(self, status: str, committed: bool | None) -> None:
        return None

    def closed(self) -> None:
        return None


def _client_side() -> tuple[_ClientSide, _Transport, _Engine]:
    transport, engine = _Transport(), _Engine()
    conversation = Conversation(cast(Any, _Writer()), cast(Any, _Writer()), Tracker())
    frontend = FrontendReader()
    frontend.authenticated()
    side = _ClientSide(cast(Any, transport), frontend, conversation, engine)
    return side, transport, engine


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_agent_is_paused_only_if_it_says_more_while_a_statement_runs() -> None:
    side, transport, engine = _client_side()
    side.data_received(messages.query("INSERT 1"))
    await _settle()
    assert engine.ran == ["INSERT 1"]
    assert transport.pauses == 0  # an agent waiting for its answer costs no pause
    side.data_received(messages.query("INSERT 2"))
    assert transport.paused  # read no further until the engine is done
    assert engine.ran == ["INSERT 1"]
    engine.go_on.set()
    await _settle()
    assert engine.ran == ["INSERT 1", "INSERT 2"]
    side.stop()


async def test_the_agent_leaving_mid_statement_is_seen_once_the_engine_is_done() -> None:
    side, transport, engine = _client_side()
    side.data_received(messages.query("INSERT 1"))
    await _settle()
    assert side.eof_received() is True  # kept open, not read
    await _settle()
    assert not side.ended.done()  # the statement is not cut short
    engine.go_on.set()
    await _settle()
    assert side.ended.done()
    assert side.ended.exception() is None
    assert transport.closed


async def test_a_connection_broken_mid_statement_ends_the_session_after_it() -> None:
    side, _, engine = _client_side()
    side.data_received(messages.query("INSERT 1"))
    await _settle()
    broken = ConnectionResetError("reset")
    side.connection_lost(broken)
    await _settle()
    assert not side.ended.done()
    engine.go_on.set()
    await _settle()
    assert side.ended.done()
    assert side.ended.exception() is broken


KINDS = frozenset({"INSERT", "UPDATE", "DELETE", "CREATE", "DROP", "DO"})


def _one_search(kinds: frozenset[str]) -> re.Pattern[bytes]:
    """The first look as it was: one search for all it looks for."""
    words = sorted((re.escape(kind.encode()) for kind in kinds), key=len, reverse=True)
    leading = [b"--", rb"/\*"] + ([b"(?:" + b"|".join(words) + b")(?![A-Za-z])"] if words else [])
    return re.compile(
        rb"\A\s*(?:" + b"|".join(leading) + rb")|;[\s;]*[^\s;]|(?-i:sidecar:key)",
        re.IGNORECASE,
    )


# Queries made of the pieces the first look cares about, in any order and case.
_PIECES = st.sampled_from(
    [" ", "\t", "\n", ";", "--", "/*", "*/", "insert", "Drop", "DOES", "do", "x", "é",
     "select 1", "sidecar:key", "SIDECAR:KEY", "'", "creates"]
)  # fmt: skip


@given(st.lists(_PIECES, max_size=12).map("".join), st.sampled_from([KINDS, frozenset()]))
def test_the_first_look_finds_what_one_search_found(text: str, kinds: frozenset[str]) -> None:
    sql = text.encode()
    assert _FirstLook(kinds)(sql) == (_one_search(kinds).search(sql) is not None), sql


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=6))
def test_spans_cut_a_run_of_bytes_at_each_start(sizes: list[int]) -> None:
    starts = list(itertools.accumulate([0, *sizes[:-1]])) if sizes else []
    chunk = bytes(sum(sizes))
    cut = list(spans(chunk, starts))
    assert [end - at for at, end in cut] == sizes
