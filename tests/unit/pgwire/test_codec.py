"""Framing of the PostgreSQL v3 protocol: bytes in any chunks, messages out, exact bytes kept."""

from __future__ import annotations

import struct

import pytest

from sidecar.pgwire import messages
from sidecar.pgwire.codec import (
    BIND_REQUEST,
    CANCEL_REQUEST,
    GSSENC_REQUEST,
    MAX_MESSAGE,
    MAX_STARTUP,
    PROTOCOL_3,
    SSL_REQUEST,
    BackendReader,
    FrontendReader,
    ProtocolError,
    bind_request,
    cstring,
    message,
    startup_packet,
)

# A client's extended-protocol run and a server's answer to a simple query, as sent.
CLIENT_STREAM = [
    messages.parse_message("s1", "SELECT $1::int"),
    messages.bind_message("p1", "s1", [b"42"]),
    message(b"D", b"Pp1\0"),
    messages.execute_message("p1"),
    messages.SYNC,
    messages.query("SELECT 'a;b'"),
    message(b"X", b""),
]
SERVER_STREAM = [
    message(b"T", b"\0\x01a\0" + b"\0" * 18),
    message(b"D", b"\0\x01\0\0\0\x03a;b"),
    messages.command_complete("SELECT 1"),
    messages.ready_for_query("I"),
]


def _feed_in_chunks(reader: FrontendReader | BackendReader, data: bytes, size: int) -> list:
    got = []
    for at in range(0, len(data), size):
        got += reader.feed(data[at : at + size])
    return got


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 64, 10_000])
def test_a_message_split_across_reads_is_reassembled_byte_for_byte(size):
    stream = b"".join(CLIENT_STREAM)
    got = _feed_in_chunks(FrontendReader(), stream, size)
    assert [m.raw for m in got] == CLIENT_STREAM
    assert [m.kind for m in got] == [b"P", b"B", b"D", b"E", b"S", b"Q", b"X"]
    assert [m.body for m in got] == [raw[5:] for raw in CLIENT_STREAM]


@pytest.mark.parametrize("size", [1, 4, 5, 6, 11, 1000])
def test_server_messages_split_anywhere_come_out_whole(size):
    stream = b"".join(SERVER_STREAM)
    got = _feed_in_chunks(BackendReader(), stream, size)
    assert [m.raw for m in got] == SERVER_STREAM
    assert messages.command_tag(got[2]) == "SELECT 1"
    assert messages.ready_status(got[3]) == "I"


def test_several_messages_in_one_chunk_all_come_out_in_order():
    reader = BackendReader()
    got = reader.feed(b"".join(SERVER_STREAM))
    assert [m.kind for m in got] == [b"T", b"D", b"C", b"Z"]
    assert b"".join(m.raw for m in got) == b"".join(SERVER_STREAM)


def test_an_incomplete_message_waits_for_its_remaining_bytes():
    q = messages.query("SELECT 1")
    reader = FrontendReader()
    first = reader.feed(q + q[:4])
    assert [m.raw for m in first] == [q]
    assert reader.feed(q[4:-1]) == []
    (last,) = reader.feed(q[-1:])
    assert last.raw == q


def test_a_large_message_kept_while_it_arrives_comes_out_whole_with_its_neighbours():
    """A large message (a 1 MiB value in a Bind) comes in many reads; what is put back in
    front of it (unread) or held after it meanwhile keeps its place."""
    big = message(b"B", b"v" * (1 << 20))
    small = messages.query("SELECT 1")
    reader = FrontendReader()
    reader.authenticated()  # (before, a message is at most 64 KiB)
    assert reader.feed_chunk(big[:3]) == (b"", [])  # not even its length yet
    for at in range(3, 600_000, 65_536):
        assert reader.feed_chunk(big[at : min(at + 65_536, 600_000)]) == (b"", [])
    reader.unread(small)  # a whole message framed before, framed again first
    reader.hold(big[600_000:700_000])
    assert reader.feed_chunk(b"") == (small, [0])
    assert reader.feed_chunk(big[700_000:-1]) == (b"", [])
    assert reader.feed_chunk(big[-1:] + small[:2]) == (big, [0])
    assert reader.leftover() == small[:2]


def test_a_message_with_an_empty_body_is_five_bytes():
    (sync,) = FrontendReader().feed(messages.SYNC)
    assert (sync.kind, sync.body, sync.raw) == (b"S", b"", b"S\0\0\0\x04")


def test_the_startup_packet_carries_its_parameters():
    packet = startup_packet({"user": "agent", "database": "shop", "options": "-c x=1"})
    reader = FrontendReader()
    startup = reader.feed_startup(packet)
    assert startup is not None
    assert startup.code == PROTOCOL_3
    assert startup.raw == packet
    assert startup.parameters == {"user": "agent", "database": "shop", "options": "-c x=1"}
    assert reader.started


def test_a_startup_packet_split_across_reads_waits_for_all_of_it():
    packet = startup_packet({"user": "agent", "application_name": "ünïcode"})
    reader = FrontendReader()
    for at in range(len(packet) - 1):
        assert reader.feed_startup(packet[at : at + 1]) is None
    startup = reader.feed_startup(packet[-1:])
    assert startup is not None
    assert startup.parameters == {"user": "agent", "application_name": "ünïcode"}


def test_startup_parameters_stop_at_the_terminator_and_ignore_what_follows():
    body = b"user\0agent\0\0junk\0value\0"
    packet = struct.pack("!ii", len(body) + 8, PROTOCOL_3) + body
    startup = FrontendReader().feed_startup(packet)
    assert startup is not None
    assert startup.parameters == {"user": "agent"}


def test_bytes_pipelined_after_the_startup_packet_are_kept_for_the_session():
    packet = startup_packet({"user": "agent"})
    early = messages.query("SELECT 1")
    reader = FrontendReader()
    startup = reader.feed_startup(packet + early)
    assert startup is not None
    assert startup.raw == packet
    assert reader.leftover() == early
    assert reader.leftover() == b""


@pytest.mark.parametrize(
    ("code", "name"),
    [(SSL_REQUEST, "SSLRequest"), (GSSENC_REQUEST, "GSSENCRequest"), (CANCEL_REQUEST, "Cancel")],
)
def test_the_special_startup_requests_are_recognised_by_their_code(code, name):
    body = struct.pack("!ii", 1234, 5678) if code == CANCEL_REQUEST else b""
    packet = struct.pack("!ii", 8 + len(body), code) + body
    reader = FrontendReader()
    request = reader.feed_startup(packet)
    assert request is not None, name
    assert request.code == code
    assert request.raw == packet
    assert not reader.started  # the real startup packet is still to come


def test_the_codes_are_the_ones_postgresql_defines():
    # 1234 << 16 | 5678 (SSL), 5680 (GSS), 5678 - 2 (cancel); 3 << 16 for protocol 3.0
    assert (SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST) == (
        1234 << 16 | 5679,
        1234 << 16 | 5680,
        1234 << 16 | 5678,
    )
    assert PROTOCOL_3 == 3 << 16


def test_a_startup_packet_after_an_ssl_request_is_read_by_the_same_reader():
    reader = FrontendReader()
    ssl = reader.feed_startup(struct.pack("!ii", 8, SSL_REQUEST))
    assert ssl is not None
    assert ssl.code == SSL_REQUEST
    startup = reader.feed_startup(startup_packet({"user": "u"}))
    assert startup is not None
    assert startup.code == PROTOCOL_3
    assert startup.parameters == {"user": "u"}


@pytest.mark.parametrize("code", [SSL_REQUEST, GSSENC_REQUEST])
def test_bytes_sent_before_the_answer_to_an_encryption_request_are_refused(code):
    # The client must wait for the one-byte answer; PostgreSQL refuses pipelined bytes
    # ("received unencrypted data after SSL request") rather than leave them unread.
    reader = FrontendReader()
    with pytest.raises(ProtocolError, match="after an SSL or GSS"):
        reader.feed_startup(struct.pack("!ii", 8, code) + startup_packet({"user": "u"}))


def test_a_cancel_request_carries_the_backend_key():
    packet = struct.pack("!iiii", 16, CANCEL_REQUEST, 4242, -17)
    request = FrontendReader().feed_startup(packet)
    assert request is not None
    assert request.cancel_key == (4242, -17)


def test_a_cancel_request_without_a_whole_key_is_a_protocol_error():
    request = FrontendReader().feed_startup(struct.pack("!iii", 12, CANCEL_REQUEST, 4242))
    assert request is not None
    with pytest.raises(ProtocolError):
        _ = request.cancel_key


@pytest.mark.parametrize("code", [0, 1, 2 << 16, PROTOCOL_3 + 1, 80877105, -1])
def test_an_unknown_startup_code_is_a_protocol_error(code):
    with pytest.raises(ProtocolError, match="unsupported"):
        FrontendReader().feed_startup(struct.pack("!ii", 8, code))


@pytest.mark.parametrize("length", [-1, 0, 4, 7, MAX_STARTUP + 1, 1 << 30])
def test_an_impossible_startup_length_is_a_protocol_error(length):
    with pytest.raises(ProtocolError, match="length"):
        FrontendReader().feed_startup(struct.pack("!ii", length, PROTOCOL_3))


def test_a_startup_packet_of_the_largest_allowed_size_is_accepted():
    body = b"user\0u\0application_name\0"
    body += b"x" * (MAX_STARTUP - 8 - len(body) - 2) + b"\0\0"
    packet = struct.pack("!ii", MAX_STARTUP, PROTOCOL_3) + body
    startup = FrontendReader().feed_startup(packet)
    assert startup is not None
    assert len(startup.raw) == MAX_STARTUP
    assert startup.parameters["application_name"] == "x" * (MAX_STARTUP - 8 - 24 - 2)


def test_fewer_than_eight_startup_bytes_wait_for_more():
    reader = FrontendReader()
    assert reader.feed_startup(b"\0\0\0") is None
    assert reader.feed_startup(b"\x08\x04\xd2") is None
    request = reader.feed_startup(b"\x16\x2f")
    assert request is not None
    assert request.code == SSL_REQUEST


@pytest.mark.parametrize("length", [-5, 0, 3, MAX_MESSAGE + 1, -(1 << 31)])
@pytest.mark.parametrize("reader_type", [FrontendReader, BackendReader])
def test_a_typed_message_with_an_impossible_length_is_a_protocol_error(length, reader_type):
    with pytest.raises(ProtocolError, match="length"):
        reader_type().feed(b"Q" + struct.pack("!i", length))


def test_a_message_with_a_huge_but_allowed_length_is_awaited_not_refused():
    reader = BackendReader()
    assert reader.feed(b"D" + struct.pack("!i", MAX_MESSAGE) + b"partial") == []


def test_a_bad_length_after_good_messages_is_still_a_protocol_error():
    reader = FrontendReader()
    assert len(reader.feed(messages.SYNC)) == 1
    with pytest.raises(ProtocolError):
        reader.feed(messages.SYNC + b"P\0\0\0\x02")


def test_message_builds_type_length_body_with_the_length_counting_itself():
    assert message(b"Q", b"SELECT 1\0") == b"Q\0\0\0\x0dSELECT 1\0"


def test_cstring_reads_up_to_the_nul_and_refuses_an_unterminated_one():
    assert cstring(b"ab\0cd\0", 0) == ("ab", 3)
    assert cstring(b"ab\0cd\0", 3) == ("cd", 6)
    assert cstring(b"\xff\0") == ("\ufffd", 2)
    with pytest.raises(ProtocolError, match="unterminated"):
        cstring(b"abc")


def test_a_bind_request_and_the_ssl_request_after_it_are_read_one_by_one() -> None:
    reader = FrontendReader()
    first = reader.feed_startup(
        bind_request("task-1", "att-9") + struct.pack("!ii", 8, SSL_REQUEST)
    )
    assert first is not None
    assert first.code == BIND_REQUEST
    assert first.bound_to == ("task-1", "att-9")
    second = reader.feed_startup(b"")
    assert second is not None
    assert second.code == SSL_REQUEST


def test_a_bind_request_without_an_attempt_is_a_protocol_error() -> None:
    startup = FrontendReader().feed_startup(struct.pack("!ii", 13, BIND_REQUEST) + b"task\0")
    assert startup is not None
    with pytest.raises(ProtocolError, match="name a task and an attempt"):
        _ = startup.bound_to


@pytest.mark.parametrize("size", [1, 3, 7, 64])
def test_a_chunk_is_the_whole_messages_as_sent_and_where_each_starts(size):
    """The relay's fast path: whole messages as one run of bytes, never cut or reordered."""
    data = b"".join(SERVER_STREAM)
    reader = BackendReader()
    chunks: list[bytes] = []
    starts: list[int] = []
    for at in range(0, len(data), size):
        chunk, found = reader.feed_chunk(data[at : at + size])
        starts += [sum(map(len, chunks)) + s for s in found]
        chunks.append(chunk)
    assert b"".join(chunks) == data
    assert [data[s : s + 1] for s in starts] == [m[:1] for m in SERVER_STREAM]
    assert reader.transaction_status == "I"


def test_a_whole_read_is_relayed_as_read_without_a_copy():
    data = b"".join(SERVER_STREAM)
    chunk, _ = BackendReader().feed_chunk(data)
    assert chunk is data


def test_bytes_put_back_are_framed_again_before_what_came_after():
    reader = FrontendReader()
    reader.authenticated()
    first, second = messages.query("SELECT 1"), messages.query("SELECT 2")
    chunk, starts = reader.feed_chunk(first + second + messages.SYNC[:2])
    assert starts == [0, len(first)]
    reader.unread(chunk[len(first) :])  # the engine took the first: the rest waits
    reader.hold(messages.SYNC[2:])  # arrived meanwhile
    chunk, starts = reader.feed_chunk(b"")
    assert chunk == second + messages.SYNC
    assert starts == [0, len(second)]
