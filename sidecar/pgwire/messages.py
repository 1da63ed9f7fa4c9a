"""Decoding the messages the sidecar acts on, and building the ones it answers with."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from sidecar.pgwire.codec import Message, ProtocolError, cstring, message

# ---- frontend --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parse:
    name: str
    query: str


@dataclass(frozen=True, slots=True)
class Bind:
    portal: str
    statement: str
    parameters: tuple[bytes | None, ...]
    parameter_formats: tuple[int, ...]
    result_formats: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Execute:
    portal: str
    max_rows: int


@dataclass(frozen=True, slots=True)
class Describe:
    target: str  # "S" statement, "P" portal
    name: str


@dataclass(frozen=True, slots=True)
class Close:
    target: str
    name: str


def query_text(m: Message) -> str:
    return cstring(m.body)[0]


def parse(m: Message) -> Parse:
    name, at = cstring(m.body)
    query, _ = cstring(m.body, at)
    return Parse(name, query)


def _int16(body: bytes, at: int) -> tuple[int, int]:
    if at + 2 > len(body):
        raise ProtocolError("message truncated")
    return struct.unpack_from("!h", body, at)[0], at + 2


def bind(m: Message) -> Bind:
    body = m.body
    portal, at = cstring(body)
    statement, at = cstring(body, at)
    count, at = _int16(body, at)
    formats = []
    for _ in range(count):
        code, at = _int16(body, at)
        formats.append(code)
    count, at = _int16(body, at)
    parameters: list[bytes | None] = []
    for _ in range(count):
        if at + 4 > len(body):
            raise ProtocolError("Bind truncated")
        (length,) = struct.unpack_from("!i", body, at)
        at += 4
        if length == -1:
            parameters.append(None)
            continue
        if length < 0:
            raise ProtocolError(f"Bind parameter length {length}")
        if at + length > len(body):
            raise ProtocolError("Bind parameter runs past the message")
        parameters.append(body[at : at + length])
        at += length
    count, at = _int16(body, at)
    results = []
    for _ in range(count):
        code, at = _int16(body, at)
        results.append(code)
    return Bind(portal, statement, tuple(parameters), tuple(formats), tuple(results))


def execute(m: Message) -> Execute:
    portal, at = cstring(m.body)
    if at + 4 > len(m.body):
        raise ProtocolError("Execute truncated")
    return Execute(portal, struct.unpack_from("!i", m.body, at)[0])


def describe(m: Message) -> Describe:
    if not m.body:
        raise ProtocolError("Describe truncated")
    return Describe(chr(m.body[0]), cstring(m.body, 1)[0])


def close(m: Message) -> Close:
    if not m.body:
        raise ProtocolError("Close truncated")
    return Close(chr(m.body[0]), cstring(m.body, 1)[0])


# ---- backend ---------------------------------------------------------------------------


def ready_status(m: Message) -> str:
    """ReadyForQuery's transaction status: I idle, T in a transaction, E failed one."""
    return chr(m.body[0]) if m.body else "I"


def command_tag(m: Message) -> str:
    return cstring(m.body)[0]


def error_fields(m: Message) -> dict[str, str]:
    """ErrorResponse/NoticeResponse fields by code: C sqlstate, M message, S severity..."""
    fields: dict[str, str] = {}
    at = 0
    while at < len(m.body) and m.body[at] != 0:
        code = chr(m.body[at])
        value, at = cstring(m.body, at + 1)
        fields[code] = value
    return fields


def backend_key(m: Message) -> tuple[int, int]:
    if len(m.body) < 8:
        raise ProtocolError("BackendKeyData truncated")
    pid, secret = struct.unpack("!ii", m.body[:8])
    return pid, secret


def auth_code(m: Message) -> int:
    return int(struct.unpack_from("!i", m.body)[0]) if len(m.body) >= 4 else -1


def sasl_mechanisms(m: Message) -> list[str]:
    """The mechanisms an AuthenticationSASL message offers."""
    try:
        return [p.decode() for p in m.body[4:].split(b"\0") if p]
    except UnicodeDecodeError as error:
        # Re-encoded as offered (sasl_offer): a name that is not text cannot be kept.
        raise ProtocolError(f"SASL mechanism name is not UTF-8: {error}") from None


def sasl_offer(mechanisms: list[str]) -> bytes:
    body = struct.pack("!i", 10) + b"".join(n.encode() + b"\0" for n in mechanisms) + b"\0"
    return message(b"R", body)


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode())


def command_complete(tag: str) -> bytes:
    return message(b"C", tag.encode() + b"\0")


def error_response(
    code: str, text: str, detail: str | None = None, *, severity: str = "ERROR"
) -> bytes:
    """An error the client shows as it would any server error (FATAL: the connection ends)."""
    level = severity.encode()
    body = b"S" + level + b"\0V" + level + b"\0C" + code.encode() + b"\0M" + text.encode() + b"\0"
    if detail:
        body += b"D" + detail.encode() + b"\0"
    return message(b"E", body + b"\0")


PARSE_COMPLETE = message(b"1", b"")
BIND_COMPLETE = message(b"2", b"")
NO_DATA = message(b"n", b"")


# ---- frontend messages the sidecar sends on its own account ---------------------------


def query(sql: str) -> bytes:
    return message(b"Q", sql.encode() + b"\0")


def copy_in_response(*, text: bool, columns: int) -> bytes:
    """Asks the client for COPY FROM STDIN rows: in text (or binary) format, ``columns``
    of them, each in that format."""
    code = 0 if text else 1
    return message(b"G", struct.pack(f"!bh{columns}h", code, columns, *[code] * columns))


def copy_fail(reason: str) -> bytes:
    """Ends a COPY FROM STDIN the server started: it fails the statement with ``reason``."""
    return message(b"f", reason.encode() + b"\0")


# Packed once: the sidecar builds a record's request (five of these messages) twice per
# recorded statement.
_INT16 = struct.Struct("!h")
_INT32 = struct.Struct("!i")
_NULL = _INT32.pack(-1)


def parse_message(name: str, sql: str) -> bytes:
    return message(b"P", name.encode() + b"\0" + sql.encode() + b"\0\0\0")  # no types given


def bind_message(portal: str, statement: str, parameters: list[bytes | None]) -> bytes:
    values = b"".join(
        [_NULL if value is None else _INT32.pack(len(value)) + value for value in parameters]
    )
    # Every parameter in text format (no format codes), and the results in text too.
    body = b"%s\0%s\0\0\0%s%s\0\0" % (
        portal.encode(), statement.encode(), _INT16.pack(len(parameters)), values
    )  # fmt: skip
    return message(b"B", body)


def execute_message(portal: str) -> bytes:
    return message(b"E", portal.encode() + b"\0\0\0\0\0")  # every row


def close_message(target: str, name: str) -> bytes:
    return message(b"C", target.encode() + name.encode() + b"\0")


SYNC = message(b"S", b"")
FLUSH = message(b"H", b"")


def data_row_values(m: Message) -> list[bytes | None]:
    """The column values of a DataRow (None for NULL)."""
    body = m.body
    count, at = _int16(body, 0)
    values: list[bytes | None] = []
    for _ in range(count):
        if at + 4 > len(body):
            raise ProtocolError("DataRow truncated")
        (length,) = struct.unpack_from("!i", body, at)
        at += 4
        if length == -1:
            values.append(None)
            continue
        if length < 0 or at + length > len(body):
            raise ProtocolError(f"DataRow value of length {length} runs past the message")
        values.append(body[at : at + length])
        at += length
    return values
