"""Garbage in, ProtocolError out: the codec, the decoders and a running relay never crash.

The sans-io half feeds random bytes and truncated messages to the readers and to every
decoder.  The relay half runs a real :class:`~sidecar.pgwire.relay.Relay` (with the
session :mod:`sidecar.serve.server` wires, with an engine that guards nothing) in front of a fake
PostgreSQL server, and sends it random typed messages after a valid start-up, or random
bytes instead of one.  Each bad connection must end with PostgreSQL's answer to a
protocol violation - a FATAL ErrorResponse with SQLSTATE 08P01, then the close - and the
relay must go on serving the next connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sidecar.pgwire import messages
from sidecar.pgwire.codec import (
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    PROTOCOL_3,
    SSL_REQUEST,
    BackendReader,
    FrontendReader,
    Message,
    ProtocolError,
    message,
    startup_packet,
)
from sidecar.pgwire.relay import Relay, Upstream
from sidecar.pgwire.session import Conversation, Link, Portal, run_session
from sidecar.recording.bindings import BindRequest

FUZZ = settings(max_examples=200, deadline=None)
RELAY_FUZZ = settings(max_examples=120, deadline=None)
WAIT_S = 5.0

# ---- sans-io: readers and decoders ------------------------------------------------------

DECODERS: list[Callable[[Message], object]] = [
    messages.query_text,
    messages.parse,
    messages.bind,
    messages.execute,
    messages.describe,
    messages.close,
    messages.ready_status,
    messages.command_tag,
    messages.error_fields,
    messages.backend_key,
    messages.auth_code,
    messages.sasl_mechanisms,
    messages.data_row_values,
]


class NothingGuarded:
    """An exactly-once engine whose rules match no statement: the session frames and
    tracks every message, and hands none over."""

    def might_guard(self, sql: bytes) -> bool:
        return True  # every query decoded and looked at, as when it could be recorded

    def guards(self, sql: str) -> bool:
        return False

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        raise AssertionError("nothing is guarded")

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        raise AssertionError("nothing is guarded")

    def ready(self, status: str, committed: bool | None) -> None:
        pass

    def closed(self) -> None:
        pass


def texts(min_size: int = 0, max_size: int = 20) -> st.SearchStrategy[str]:
    """Text a C string can carry: UTF-8, no NUL."""
    return st.text(
        st.characters(codec="utf-8", exclude_characters="\0"), min_size=min_size, max_size=max_size
    )


names = texts(max_size=12)
values = st.none() | st.binary(max_size=20)


def _bind_body(
    formats: list[int], parameters: list[bytes | None], results: list[int], portal: str, stmt: str
) -> bytes:
    body = portal.encode() + b"\0" + stmt.encode() + b"\0"
    body += struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    body += struct.pack("!h", len(parameters))
    for value in parameters:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    return body + struct.pack("!h", len(results)) + b"".join(struct.pack("!h", f) for f in results)


formats = st.lists(st.sampled_from([0, 1]), max_size=4)
bind_bodies = st.builds(_bind_body, formats, st.lists(values, max_size=4), formats, names, names)


def _data_row_body(row: list[bytes | None]) -> bytes:
    body = struct.pack("!h", len(row))
    for v in row:
        body += struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v
    return body


data_row_bodies = st.lists(values, max_size=5).map(_data_row_body)

#: Valid messages of every type the sidecar decodes, client's and server's.
valid_messages = st.one_of(
    st.builds(messages.query, texts(max_size=30)),
    st.builds(messages.parse_message, names, texts(max_size=30)),
    st.builds(messages.bind_message, names, names, st.lists(values, max_size=4)),
    bind_bodies.map(lambda body: message(b"B", body)),
    st.builds(messages.execute_message, names),
    st.builds(messages.close_message, st.sampled_from(["S", "P"]), names),
    st.builds(
        lambda t, n: message(b"D", t + n.encode() + b"\0"), st.sampled_from([b"S", b"P"]), names
    ),
    st.sampled_from([messages.SYNC, messages.FLUSH, message(b"X", b"")]),
    st.builds(messages.ready_for_query, st.sampled_from(["I", "T", "E"])),
    st.builds(messages.command_complete, texts(max_size=20)),
    st.builds(
        lambda code, text, detail, severity: messages.error_response(
            code, text, detail, severity=severity
        ),
        texts(min_size=5, max_size=5),
        texts(max_size=20),
        st.none() | texts(max_size=20),
        st.sampled_from(["ERROR", "FATAL"]),
    ),
    st.builds(messages.sasl_offer, st.lists(texts(min_size=1, max_size=15), max_size=3)),
    st.builds(
        lambda k: message(b"K", struct.pack("!ii", *k)),
        st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1)),
    ),
    data_row_bodies.map(lambda body: message(b"D", body)),
)


@st.composite
def truncated(draw: st.DrawFn, source: st.SearchStrategy[bytes] = valid_messages) -> bytes:
    """A valid message cut short anywhere in its body, its length field made to agree."""
    raw = draw(source)
    body = raw[5:]
    cut = draw(st.integers(0, len(body)))
    return message(raw[:1], body[:cut])


def _chunks(data: bytes, sizes: list[int]) -> Iterator[bytes]:
    at = 0
    for size in sizes:
        yield data[at : at + size]
        at += size
    yield data[at:]


def _decode_all(m: Message) -> None:
    for decode in DECODERS:
        with contextlib.suppress(ProtocolError):
            decode(m)


@given(st.binary(max_size=300))
@FUZZ
def test_every_decoder_turns_random_bytes_into_a_value_or_a_protocol_error(body):
    _decode_all(Message(b"?", body, message(b"?", body)))


@given(truncated())
@FUZZ
def test_every_decoder_turns_a_truncated_message_into_a_value_or_a_protocol_error(raw):
    (m,) = BackendReader().feed(raw)
    _decode_all(m)


@given(valid_messages, st.integers(0, 1000), st.integers(1, 255))
@FUZZ
def test_every_decoder_turns_a_corrupted_message_into_a_value_or_a_protocol_error(raw, at, xor):
    body = bytearray(raw[5:])
    if body:
        body[at % len(body)] ^= xor
    _decode_all(Message(raw[:1], bytes(body), message(raw[:1], bytes(body))))


@given(formats, st.lists(values, max_size=6), formats, names, names)
@FUZZ
def test_any_bind_decodes_to_what_was_encoded(parameter_formats, parameters, results, portal, stmt):
    body = _bind_body(parameter_formats, parameters, results, portal, stmt)
    bind = messages.bind(Message(b"B", body, message(b"B", body)))
    assert bind == messages.Bind(
        portal, stmt, tuple(parameters), tuple(parameter_formats), tuple(results)
    )


@given(st.lists(values, max_size=8))
@FUZZ
def test_any_data_row_decodes_to_its_values(row):
    body = _data_row_body(row)
    assert messages.data_row_values(Message(b"D", body, message(b"D", body))) == row


@given(st.lists(valid_messages, max_size=8), st.lists(st.integers(1, 40), max_size=30))
@FUZZ
def test_a_stream_of_valid_messages_comes_out_whole_however_it_is_cut(raws, sizes):
    reader = BackendReader()
    got = [m for chunk in _chunks(b"".join(raws), sizes) for m in reader.feed(chunk)]
    assert [m.raw for m in got] == raws


@given(st.binary(max_size=400), st.lists(st.integers(1, 64), max_size=20))
@FUZZ
def test_random_bytes_through_the_backend_reader_are_messages_or_a_protocol_error(data, sizes):
    reader = BackendReader()
    seen = b""
    with contextlib.suppress(ProtocolError):
        for chunk in _chunks(data, sizes):
            seen += b"".join(m.raw for m in reader.feed(chunk))
    assert data.startswith(seen), "the messages are the bytes received, in order"


@given(st.binary(max_size=400), st.lists(st.integers(1, 64), max_size=20), st.booleans())
@FUZZ
def test_random_bytes_through_the_frontend_reader_are_messages_or_a_protocol_error(
    data, sizes, with_startup
):
    reader = FrontendReader()
    if with_startup:
        data = startup_packet({"user": "u"}) + data
    seen = b""
    with contextlib.suppress(ProtocolError):
        for chunk in _chunks(data, sizes):
            if not reader.started:
                startup = reader.feed_startup(chunk)
                if startup is not None:
                    seen += startup.raw
                if reader.started:
                    seen += b"".join(m.raw for m in reader.feed(b""))
            else:
                seen += b"".join(m.raw for m in reader.feed(chunk))
    assert data.startswith(seen), "the messages are the bytes received, in order"


@given(
    st.integers(-(2**31), 2**31 - 1),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=64),
)
@FUZZ
def test_any_startup_header_is_a_request_a_wait_or_a_protocol_error(length, code, rest):
    reader = FrontendReader()
    try:
        startup = reader.feed_startup(struct.pack("!ii", length, code) + rest)
    except ProtocolError:
        return
    if startup is None:
        assert 8 + len(rest) < length
        return
    assert startup.code in (PROTOCOL_3, SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST)
    assert len(startup.raw) == length
    _ = startup.parameters
    with contextlib.suppress(ProtocolError):
        _ = startup.cancel_key


# ---- the relay, running, in front of a fake PostgreSQL ----------------------------------

DECODED_BY_SESSION = {
    b"P": messages.parse,
    b"B": messages.bind,
    b"C": messages.close,
    b"Q": messages.query_text,
    b"E": messages.execute,
}
PROBE = "SELECT 'probe'"


def _refusal(text: str) -> bytes:
    return messages.error_response("08P01", text, severity="FATAL")


#: The fake server's answer to each request type it knows (Q: see ``_answer``).
ANSWERS = {
    b"P": messages.PARSE_COMPLETE,
    b"B": messages.BIND_COMPLETE,
    b"D": messages.NO_DATA,
    b"E": messages.command_complete("SELECT 0"),
    b"C": message(b"3", b""),
    b"S": messages.ready_for_query("I"),
    b"H": b"",
    # CopyData, CopyDone and CopyFail outside a COPY are ignored, as PostgreSQL does.
    b"d": b"",
    b"c": b"",
    b"f": b"",
}
KNOWN_TO_SERVER = {*ANSWERS, b"Q", b"X"}


def _answer(m: Message) -> bytes:
    """The fake server's answer to a request it knows."""
    if m.kind != b"Q":
        return ANSWERS[m.kind]
    try:
        sql = messages.query_text(m)
    except ProtocolError:
        refusal = messages.error_response("08P01", "invalid string in message")
        return refusal + messages.ready_for_query("I")
    tag = "PROBE" if sql == PROBE else "SELECT 1"
    return messages.command_complete(tag) + messages.ready_for_query("I")


@dataclass
class FakePostgres:
    """Just enough of a PostgreSQL server: trust auth, and an answer to each request."""

    failures: list[BaseException] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(reader, writer)
        except ConnectionError:
            pass
        except Exception as error:  # the test fails on it, instead of asyncio's log
            self.failures.append(error)
        finally:
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frontend = FrontendReader()
        startup = None
        while startup is None:
            data = await reader.read(1 << 16)
            if not data:
                return
            startup = frontend.feed_startup(data)
        if startup.code != PROTOCOL_3:
            return  # a cancel request: nothing to answer
        writer.write(
            message(b"R", struct.pack("!i", 0))
            + message(b"S", b"server_version\x0016.0\0")
            + message(b"K", struct.pack("!ii", 4242, 1234))
            + messages.ready_for_query("I")
        )
        data = frontend.leftover()
        while True:
            try:
                received = frontend.feed(data)
            except ProtocolError:
                await _refuse(reader, writer, "invalid message length")
                return
            for m in received:
                if m.kind == b"X":
                    return
                if m.kind not in KNOWN_TO_SERVER:
                    await _refuse(reader, writer, f"invalid frontend message type {m.kind[0]}")
                    return
                writer.write(_answer(m))
            await writer.drain()
            data = await reader.read(1 << 16)
            if not data:
                return


async def _refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, text: str) -> None:
    """As PostgreSQL does with a protocol violation: FATAL 08P01, then close - here only
    once the peer has closed too, so that no reset destroys the error on its way."""
    writer.write(_refusal(text))
    await writer.drain()
    writer.write_eof()
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(WAIT_S):
            while await reader.read(1 << 16):
                pass


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@dataclass
class Harness:
    """A relay and its fake upstream on an event loop of their own, shared by examples."""

    loop: asyncio.AbstractEventLoop
    relay_port: int
    upstream: FakePostgres
    errors: _Errors

    def run[T](self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def assert_unharmed(self) -> None:
        """The relay logged no crash and still serves a fresh, valid connection."""
        assert self.run(_healthy_connection(self.relay_port)) == ["PROBE"]
        crashes = [r.getMessage() for r in self.errors.records]
        assert not crashes, crashes
        assert not self.upstream.failures, self.upstream.failures


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    loop = asyncio.new_event_loop()
    upstream = FakePostgres()
    errors = _Errors()
    watched = [logging.getLogger("sidecar.pgwire"), logging.getLogger("asyncio")]
    for logger in watched:
        logger.addHandler(errors)

    async def session(link: Link, bind: BindRequest, parameters: dict[str, str]) -> None:
        # As sidecar.pgwire.serving.pg_relay wires it when SQL rules are loaded: every message
        # framed and inspected (with no SQL rule at all, bytes are copied unframed).
        await run_session(link, NothingGuarded())

    async def start() -> tuple[asyncio.Server, Relay, int]:
        fake = await asyncio.start_server(upstream.serve, "127.0.0.1", 0)
        fake_port = fake.sockets[0].getsockname()[1]
        relay = Relay(Upstream("127.0.0.1", fake_port, tls=False), session)
        _, port = await relay.start("127.0.0.1", 0)
        return fake, relay, port

    fake, relay, port = loop.run_until_complete(start())
    try:
        yield Harness(loop, port, upstream, errors)
    finally:

        async def stop() -> None:
            await relay.stop()
            fake.close()
            await fake.wait_closed()

        loop.run_until_complete(stop())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
        for logger in watched:
            logger.removeHandler(errors)


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _until_ready(reader: asyncio.StreamReader, backend: BackendReader) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(WAIT_S):
        while not got or got[-1].kind != b"Z":
            data = await reader.read(1 << 16)
            assert data, f"closed before ReadyForQuery, after {[m.kind for m in got]}"
            got += backend.feed(data)
    return got


async def _until_closed(reader: asyncio.StreamReader, backend: BackendReader) -> list[Message]:
    """Every message up to the close; the close must come within WAIT_S."""
    got: list[Message] = []
    try:
        async with asyncio.timeout(WAIT_S):
            while data := await reader.read(1 << 16):
                got += backend.feed(data)
    except TimeoutError:
        pytest.fail(f"the connection was not closed; received {[m.kind for m in got]}")
    return got


async def _started(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, BackendReader]:
    reader, writer = await _connect(port)
    writer.write(startup_packet({"user": "fuzz", "database": "test"}))
    backend = BackendReader()
    greeting = await _until_ready(reader, backend)
    assert [m.kind for m in greeting] == [b"R", b"S", b"K", b"Z"]
    return reader, writer, backend


async def _healthy_connection(port: int) -> list[str]:
    reader, writer, backend = await _started(port)
    try:
        writer.write(messages.query(PROBE))
        answer = await _until_ready(reader, backend)
        writer.write(message(b"X", b""))
        assert await _until_closed(reader, backend) == []
    finally:
        await _close(writer)
    return [messages.command_tag(m) for m in answer if m.kind == b"C"]


def _probe_answered(got: list[Message]) -> bool:
    return (
        len(got) >= 2
        and got[-1].kind == b"Z"
        and got[-2].kind == b"C"
        and messages.command_tag(got[-2]) == "PROBE"
    )


def _is_protocol_violation(m: Message) -> bool:
    if m.kind != b"E":
        return False
    fields = messages.error_fields(m)
    return fields.get("S") == "FATAL" and fields.get("C") == "08P01"


def _fatals(got: list[Message]) -> list[Message]:
    return [m for m in got if m.kind == b"E" and messages.error_fields(m).get("S") == "FATAL"]


def _authenticated_reader() -> FrontendReader:
    """A client's reader as the relay has it after authentication (no pre-auth cap)."""
    reader = FrontendReader()
    reader.authenticated()
    return reader


def _expected_after_startup(garbage: bytes) -> set[str]:
    """What the relay (one read of ``garbage``) and the fake server must make of it.

    ``fatal``: a FATAL 08P01 ends the connection; ``closed``: the client's Terminate ends
    it; ``open``: complete, harmless requests (the connection serves on); ``partial``: the
    same, with a message still incomplete.
    """
    try:
        _authenticated_reader().feed(garbage)
    except ProtocolError:
        # The relay refuses the whole read; a Terminate before the bad bytes counts only
        # if the bytes happened to arrive in more than one read.
        before = _authenticated_reader()
        seen: list[Message] = []
        with contextlib.suppress(ProtocolError):
            for at in range(len(garbage)):
                seen += before.feed(garbage[at : at + 1])
        return {"fatal", "closed"} if any(m.kind == b"X" for m in seen) else {"fatal"}
    reader = _authenticated_reader()
    received = reader.feed(garbage)
    server_refuses = False
    for m in received:
        if m.kind == b"X":
            # The relay passes the Terminate on and closes at once: a refusal from the
            # server may or may not make it to the client first.
            return {"fatal", "closed"} if server_refuses else {"closed"}
        decode = DECODED_BY_SESSION.get(m.kind)
        if decode is not None:
            try:
                decode(m)
            except ProtocolError:
                return {"fatal"}  # the relay's own refusal
        if m.kind not in KNOWN_TO_SERVER:
            server_refuses = True  # the server's refusal, relayed
    if server_refuses:
        return {"fatal"}
    return {"open"} if sum(len(m.raw) for m in received) == len(garbage) else {"partial"}


async def _send_after_startup(port: int, garbage: bytes) -> tuple[str, list[Message]]:
    reader, writer, backend = await _started(port)
    try:
        writer.write(garbage)
        await writer.drain()
        expected = _expected_after_startup(garbage)
        if expected & {"fatal", "closed"}:
            got = await _until_closed(reader, backend)
            outcome = "fatal" if got and _is_protocol_violation(got[-1]) else "closed"
            assert outcome in expected, (expected, [m.raw for m in got])
            if outcome == "closed":
                assert not _fatals(got)
            return outcome, got
        if expected == {"open"}:
            # In step: every request is answered, in order and unchanged, then the probe.
            writer.write(messages.query(PROBE))
            got = await _until_ready(reader, backend)
            while not _probe_answered(got):
                got += await _until_ready(reader, backend)
            requests = _authenticated_reader().feed(garbage + messages.query(PROBE))
            assert b"".join(m.raw for m in got) == b"".join(_answer(m) for m in requests)
        else:
            got = []
        writer.write_eof()  # the client goes away: the relay closes its side too
        got += await _until_closed(reader, backend)
        assert not _fatals(got), [m.raw for m in got]
        return expected.pop(), got
    finally:
        await _close(writer)


# Typed messages: valid, truncated (the length agreeing), of random type, or with a
# random length field; and plain random bytes.
kinds = st.sampled_from([bytes([k]) for k in b"QPBDECSHdcfFp\0"]) | st.binary(
    min_size=1, max_size=1
)
typed_garbage = st.one_of(
    valid_messages,
    truncated(),
    st.builds(message, kinds, st.binary(max_size=40)),
    st.builds(
        lambda k, n, b: k + struct.pack("!i", n) + b,
        kinds,
        st.integers(-(2**31), 2**31 - 1),
        st.binary(max_size=20),
    ),
    st.binary(min_size=1, max_size=30),
)
after_startup = st.lists(typed_garbage, min_size=1, max_size=6).map(b"".join)


@given(after_startup)
@RELAY_FUZZ
def test_garbage_after_startup_ends_the_connection_cleanly_and_the_relay_lives_on(harness, garbage):
    outcome, got = harness.run(_send_after_startup(harness.relay_port, garbage))
    event(f"after startup: {outcome}")
    if outcome == "fatal":
        assert _is_protocol_violation(got[-1])
    harness.assert_unharmed()


@given(st.lists(valid_messages, min_size=1, max_size=6), st.data())
@RELAY_FUZZ
def test_a_valid_stream_cut_short_never_hangs_or_crashes_the_relay(harness, raws, data):
    stream = b"".join(raws)
    cut = data.draw(st.integers(1, len(stream)))
    outcome, _ = harness.run(_send_after_startup(harness.relay_port, stream[:cut]))
    event(f"cut short: {outcome}")
    harness.assert_unharmed()


def test_a_bad_message_length_gets_fatal_08p01_from_the_relay_then_the_close(harness):
    outcome, got = harness.run(_send_after_startup(harness.relay_port, b"Q\0\0\0\x02"))
    assert outcome == "fatal"
    (error,) = got
    fields = messages.error_fields(error)
    assert fields["S"] == fields["V"] == "FATAL"
    assert fields["C"] == "08P01"
    assert fields["M"].startswith("effect-sidecar: invalid PostgreSQL protocol message")
    harness.assert_unharmed()


def test_a_malformed_bind_gets_fatal_08p01_from_the_relay_then_the_close(harness):
    bind = message(b"B", b"\0s\0\0\0\0\x01\0\0\0\x10short")
    garbage = messages.parse_message("s", "SELECT $1") + bind + messages.SYNC
    outcome, got = harness.run(_send_after_startup(harness.relay_port, garbage))
    assert outcome == "fatal"
    assert [m.kind for m in got] == [b"E"]  # the Parse before it was never sent on
    harness.assert_unharmed()


def test_requests_the_server_does_not_know_get_its_own_fatal_error_relayed(harness):
    garbage = messages.query("SELECT 1") + message(b"~", b"")
    outcome, got = harness.run(_send_after_startup(harness.relay_port, garbage))
    assert outcome == "fatal"
    assert [m.kind for m in got] == [b"C", b"Z", b"E"]
    assert messages.error_fields(got[-1])["M"] == "invalid frontend message type 126"
    harness.assert_unharmed()


def test_harmless_requests_are_answered_in_order_and_the_connection_serves_on(harness):
    garbage = (
        messages.parse_message("", "SELECT 1")
        + messages.bind_message("", "", [])
        + messages.execute_message("")
        + messages.SYNC
    )
    outcome, got = harness.run(_send_after_startup(harness.relay_port, garbage))
    assert outcome == "open"
    assert [m.kind for m in got] == [b"1", b"2", b"C", b"Z", b"C", b"Z"]
    assert messages.command_tag(got[4]) == "PROBE"
    harness.assert_unharmed()


# ---- the relay, before any startup packet -----------------------------------------------


def _expected_at_startup(garbage: bytes) -> str:
    reader = FrontendReader()
    try:
        startup = reader.feed_startup(garbage)
    except ProtocolError:
        return "fatal"
    if startup is None:
        return "partial"
    return {PROTOCOL_3: "started", CANCEL_REQUEST: "cancel"}.get(startup.code, "declined")


async def _send_at_startup(port: int, garbage: bytes) -> tuple[str, bytes]:
    reader, writer = await _connect(port)
    try:
        writer.write(garbage)
        await writer.drain()
        expected = _expected_at_startup(garbage)
        if expected == "started":
            await _until_ready(reader, BackendReader())
        elif expected == "declined":
            assert await reader.readexactly(1) == b"N"
        if expected != "fatal":
            writer.write_eof()
        received = b""
        try:
            async with asyncio.timeout(WAIT_S):
                while data := await reader.read(1 << 16):
                    received += data
        except TimeoutError:
            pytest.fail(f"the connection was not closed; received {received!r}")
        return expected, received
    finally:
        await _close(writer)


startup_garbage = st.one_of(
    st.binary(min_size=1, max_size=80),
    st.builds(
        lambda length, code, rest: struct.pack("!ii", length, code) + rest,
        st.integers(-(2**31), 2**31 - 1) | st.integers(0, 100),
        st.integers(-(2**31), 2**31 - 1).filter(
            lambda c: c not in (PROTOCOL_3, SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST)
        ),
        st.binary(max_size=100),
    ),
    st.builds(  # a real request code, then more than it may carry
        lambda code, rest: struct.pack("!ii", 8, code) + rest,
        st.sampled_from([SSL_REQUEST, GSSENC_REQUEST]),
        st.binary(min_size=1, max_size=40),
    ),
)


@given(startup_garbage)
@RELAY_FUZZ
def test_garbage_instead_of_a_startup_packet_gets_fatal_08p01_and_the_close(harness, garbage):
    expected, received = harness.run(_send_at_startup(harness.relay_port, garbage))
    event(f"at startup: {expected}")
    if expected == "fatal":
        (error,) = BackendReader().feed(received)
        assert _is_protocol_violation(error), received
    elif expected == "partial":
        assert received == b""  # nothing is answered to an incomplete start-up
    harness.assert_unharmed()


def test_an_unknown_protocol_version_gets_fatal_08p01_and_the_close(harness):
    packet = struct.pack("!ii", 8, 2 << 16)  # protocol 2.0
    expected, received = harness.run(_send_at_startup(harness.relay_port, packet))
    assert expected == "fatal"
    (error,) = BackendReader().feed(received)
    assert messages.error_fields(error)["C"] == "08P01"
    assert "unsupported protocol" in messages.error_fields(error)["M"]
    harness.assert_unharmed()


def test_a_startup_pipelined_behind_an_ssl_request_is_refused_not_left_waiting(harness):
    garbage = struct.pack("!ii", 8, SSL_REQUEST) + startup_packet({"user": "fuzz"})
    expected, received = harness.run(_send_at_startup(harness.relay_port, garbage))
    assert expected == "fatal"
    (error,) = BackendReader().feed(received)
    assert _is_protocol_violation(error)
    harness.assert_unharmed()


def test_an_ssl_request_is_declined_and_the_startup_that_follows_is_served(harness):
    async def scenario() -> list[bytes]:
        reader, writer = await _connect(harness.relay_port)
        try:
            writer.write(struct.pack("!ii", 8, SSL_REQUEST))
            assert await reader.readexactly(1) == b"N"
            writer.write(startup_packet({"user": "fuzz"}))
            return [m.kind for m in await _until_ready(reader, BackendReader())]
        finally:
            await _close(writer)

    assert harness.run(scenario()) == [b"R", b"S", b"K", b"Z"]
    harness.assert_unharmed()


@contextlib.asynccontextmanager
async def _relay_in_front_of(
    server: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
    session: Callable[..., Awaitable[None]],
    **kw: Any,
) -> AsyncIterator[int]:
    """A relay (with ``session``) in front of a fake ``server``; yields the relay's port."""
    fake = await asyncio.start_server(server, "127.0.0.1", 0)
    upstream = Upstream("127.0.0.1", fake.sockets[0].getsockname()[1], tls=False)
    relay = Relay(upstream, session, **kw)
    _, port = await relay.start("127.0.0.1", 0)
    try:
        yield port
    finally:
        await relay.stop()
        fake.close()
        await fake.wait_closed()


async def _answers_until_closed(port: int, *sent: bytes) -> list[Message]:
    """Start a connection, send ``sent``, and read every message up to the close."""
    reader, writer = await _connect(port)
    writer.write(startup_packet({"user": "fuzz", "database": "test"}) + b"".join(sent))
    try:
        return await _until_closed(reader, BackendReader())
    finally:
        await _close(writer)


async def test_an_unexpected_failure_is_told_to_the_agent_and_closes_the_connection() -> None:
    """SPEC §3.6 on the SQL path: a bug in a session is a FATAL ErrorResponse (XX000,
    sidecar_error) and a closed connection - not a silent drop, never a statement run."""

    async def broken(*_: object) -> None:
        raise RuntimeError("engine bug")

    async with _relay_in_front_of(FakePostgres().serve, broken) as port:
        got = await _answers_until_closed(port)
    last = got[-1]
    assert last.kind == b"E"
    assert b"XX000" in last.raw
    assert b"sidecar_error" in last.raw


async def _asks_for_a_password(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server that wants a cleartext password (AuthenticationCleartextPassword), then
    waits for the client."""
    await reader.read(1 << 16)
    writer.write(message(b"R", struct.pack("!i", 3)))
    await writer.drain()
    with contextlib.suppress(ConnectionError):
        while await reader.read(1 << 16):
            pass
    writer.close()


async def _never_reached(*_: object) -> None:
    raise AssertionError("authentication never finishes in these tests")


async def test_a_huge_message_before_authentication_is_refused_not_buffered() -> None:
    """Once, a password message announcing 1 GiB was buffered (RSS +256 MiB for 256 MiB
    sent): before authentication messages are capped as PostgreSQL caps them."""
    huge = b"p" + struct.pack("!i", 1 << 30) + b"x" * 1024
    async with _relay_in_front_of(_asks_for_a_password, _never_reached) as port:
        got = await _answers_until_closed(port, huge)
    assert got[-1].kind == b"E"  # refused as soon as the length was read
    assert b"08P01" in got[-1].raw
    assert b"has length 1073741824" in got[-1].raw


async def test_a_half_started_connection_is_closed_after_the_authentication_timeout() -> None:
    relay = _relay_in_front_of(_asks_for_a_password, _never_reached, authentication_timeout_s=0.5)
    async with relay as port:
        idle_reader, idle_writer = await _connect(port)  # says nothing at all
        try:
            idle = await _until_closed(idle_reader, BackendReader())
        finally:
            await _close(idle_writer)
        started = await _answers_until_closed(port)  # a startup packet, then nothing
    for got in (idle, started):
        assert got[-1].kind == b"E"
        assert b"authentication not finished within 0.5 s" in got[-1].raw
