"""The PostgreSQL v3 wire protocol, sans-io: bytes in, messages out.

:class:`FrontendReader` and :class:`BackendReader` cut a byte stream into messages and
keep each one's exact bytes (``raw``), so a relay forwards what it does not need to
change without rebuilding it.  Only the messages the sidecar acts on are decoded further
(:mod:`.messages`).  Nothing here touches a socket, so the readers can be fed anything -
the fuzz test does - and answer with :class:`ProtocolError`, never a crash.

Framing (https://www.postgresql.org/docs/current/protocol-message-formats.html): every
message is ``type:1 length:4 body`` with the length counting itself, except the
client's first messages (startup, SSLRequest, GSSENCRequest, CancelRequest), which have
no type byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

PROTOCOL_3 = 196608  # 3.0
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
# The sidecar's own start-up request (1234.7373, a code PostgreSQL does not use): sent
# by ``sidecar exec`` before the agent's first byte on a connection it carries from an
# isolated namespace, naming the attempt as "task\0attempt\0"; never answered.
BIND_REQUEST = (1234 << 16) | 7373

# Generous but bounded: a message larger than this is garbage or an attack, not a query.
MAX_MESSAGE = 1 << 30
MAX_STARTUP = 10_000
# Before authentication a client has proven nothing: its messages (passwords, SASL
# exchanges) are capped as PostgreSQL caps them (PG_MAX_AUTH_TOKEN_LENGTH), so a peer
# announcing a huge message is refused instead of buffered.
MAX_BEFORE_AUTH = 65_535


_LENGTH = struct.Struct("!i")
_READY = ord("Z")


class ProtocolError(ValueError):
    """The peer sent bytes that are not the PostgreSQL protocol."""


class Message:
    """One message: ``kind`` is its type byte, ``raw`` its exact bytes.

    The body is sliced out of ``raw`` only when asked for: most messages are relayed
    without ever being looked into.
    """

    __slots__ = ("_body", "kind", "raw")

    def __init__(self, kind: bytes, body: bytes | None, raw: bytes) -> None:
        self.kind = kind
        self._body = body
        self.raw = raw

    @property
    def body(self) -> bytes:
        if self._body is None:
            self._body = self.raw[5:]
        return self._body

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and (self.kind, self.raw) == (other.kind, other.raw)

    def __hash__(self) -> int:
        return hash((self.kind, self.raw))

    def __repr__(self) -> str:
        return f"Message({self.kind!r}, {self.raw!r})"


@dataclass(frozen=True, slots=True)
class Startup:
    """The client's first message: a startup packet, or a request for SSL/GSS/cancel."""

    code: int
    body: bytes
    raw: bytes

    @property
    def parameters(self) -> dict[str, str]:
        """A StartupMessage's ``name=value`` parameters (user, database, options, ...)."""
        parts = self.body.split(b"\0")
        pairs: dict[str, str] = {}
        for at in range(0, len(parts) - 1, 2):
            if not parts[at]:
                break
            pairs[parts[at].decode(errors="replace")] = parts[at + 1].decode(errors="replace")
        return pairs

    @property
    def bound_to(self) -> tuple[str, str]:
        """(task, attempt id) of the sidecar's BindRequest."""
        parts = self.body.split(b"\0")
        if len(parts) < 3 or not parts[0] or not parts[1]:
            raise ProtocolError("BindRequest must name a task and an attempt")
        return parts[0].decode(errors="replace"), parts[1].decode(errors="replace")

    @property
    def cancel_key(self) -> tuple[int, int]:
        """(process id, secret key) of a CancelRequest."""
        if len(self.body) < 8:
            raise ProtocolError("CancelRequest too short")
        pid, secret = struct.unpack("!ii", self.body[:8])
        return pid, secret


def bind_request(task: str, attempt_id: str) -> bytes:
    """The sidecar's start-up request binding the connection that follows to an attempt."""
    body = task.encode() + b"\0" + attempt_id.encode() + b"\0"
    return struct.pack("!ii", len(body) + 8, BIND_REQUEST) + body


def startup_packet(parameters: dict[str, str]) -> bytes:
    body = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in parameters.items())
    body += b"\0"
    return struct.pack("!ii", len(body) + 8, PROTOCOL_3) + body


class _Reader:
    def __init__(self, max_message: int = MAX_MESSAGE) -> None:
        self._buffer = bytearray()
        self.max_message = max_message
        # How long the buffer must grow before its first message is whole (0: look now).
        # A large message (a 50 MB bytea in a Bind) comes in many reads: each is only
        # appended until then, instead of the buffer being copied again for every read.
        self._needed = 0

    def hold(self, data: bytes) -> None:
        """Keep ``data`` after what is kept, unframed, until the next feed."""
        self._buffer += data

    def unread(self, data: bytes) -> None:
        """Put framed bytes back in front of what is kept: the next feed frames them again."""
        self._buffer[:0] = data
        self._needed = 0

    def leftover(self) -> bytes:
        """Bytes received but not yet framed (a message still arriving, or pipelined by
        an eager peer), taken out of the reader."""
        rest = bytes(self._buffer)
        self._buffer.clear()
        self._needed = 0
        return rest

    def _framed(self, data: bytes) -> list[Message]:
        """Every whole message of what was kept plus ``data``; the rest is kept."""
        chunk, starts = self._chunk(data)
        return [Message(chunk[a : a + 1], None, chunk[a:b]) for a, b in spans(chunk, starts)]

    def _chunk(self, data: bytes) -> tuple[bytes, list[int]]:
        """The whole messages of what was kept plus ``data``, as one run of bytes, and
        where each one starts in it; the rest is kept.

        A relay that forwards what it framed writes the run as it came: a read that is
        whole messages (nearly every read) is neither copied nor cut into objects."""
        if self._buffer:
            self._buffer += data
            if len(self._buffer) < self._needed:
                return b"", []  # the message it holds is still arriving
            data = bytes(self._buffer)
            self._buffer.clear()
        self._needed = 0
        starts: list[int] = []
        at, size = 0, len(data)
        while size - at >= 5:
            (length,) = _LENGTH.unpack_from(data, at + 1)
            if length < 4 or length > self.max_message:
                raise ProtocolError(f"message {data[at : at + 1]!r} has length {length}")
            end = at + 1 + length
            if size < end:
                break
            starts.append(at)
            at = end
        if at < size:
            self._buffer += memoryview(data)[at:]
            # The first message kept is whole at its end, once its header (5 bytes) tells it.
            self._needed = end - at if size - at >= 5 else 5
            data = data[:at]
        return data, starts


def spans(chunk: bytes, starts: list[int]) -> Iterator[tuple[int, int]]:
    """Where each message of a framed run of bytes starts and ends (run for every read
    of a relay that frames: one list built, nothing checked that framing ensured)."""
    ends = starts[1:]
    ends.append(len(chunk))
    return zip(starts, ends)  # noqa: B905 - as long as each other by construction


def ready_status(chunk: bytes, at: int) -> str:
    """The status of the ReadyForQuery at ``at`` in ``chunk`` ("" if it carries none)."""
    return chr(chunk[at + 5]) if _LENGTH.unpack_from(chunk, at + 1)[0] > 4 else ""


class FrontendReader(_Reader):
    """Messages from a client: first the startup phase, then typed messages."""

    def __init__(self) -> None:
        super().__init__(MAX_BEFORE_AUTH)  # lifted by authenticated()
        self.started = False

    def authenticated(self) -> None:
        """The server accepted the client: its messages may now be as large as any."""
        self.max_message = MAX_MESSAGE

    def feed_startup(self, data: bytes) -> Startup | None:
        """Feed bytes during the startup phase; the startup-phase message once complete."""
        self._buffer += data
        if len(self._buffer) < 8:
            return None
        length, code = struct.unpack_from("!ii", self._buffer)
        if length < 8 or length > MAX_STARTUP:
            raise ProtocolError(f"startup message length {length}")
        if len(self._buffer) < length:
            return None
        raw = bytes(self._buffer[:length])
        del self._buffer[:length]
        if code not in (PROTOCOL_3, SSL_REQUEST, GSSENC_REQUEST, CANCEL_REQUEST, BIND_REQUEST):
            raise ProtocolError(f"unsupported protocol or request code {code}")
        if code in (SSL_REQUEST, GSSENC_REQUEST) and self._buffer:
            # The client must wait for the answer (one byte) before it says more; bytes
            # already sent would never be read.  PostgreSQL refuses them the same way.
            raise ProtocolError("received data after an SSL or GSS encryption request")
        if code == PROTOCOL_3:
            self.started = True
        return Startup(code, raw[8:], raw)

    def feed(self, data: bytes) -> list[Message]:
        return self._framed(data)

    def feed_chunk(self, data: bytes) -> tuple[bytes, list[int]]:
        """As :meth:`feed`: the whole messages as one run of bytes and where each starts
        (see :meth:`_chunk`)."""
        return self._chunk(data)


class BackendReader(_Reader):
    """Messages from a server (every one typed, from the first)."""

    #: the transaction status of the last ReadyForQuery framed: I idle, T in a
    #: transaction, E in a failed one ("" until the first)
    transaction_status: str = ""
    #: the BackendKeyData's body the server sent at start-up (its process id and secret
    #: key): what a CancelRequest for this connection carries ("" until then)
    key_data: bytes = b""

    def feed(self, data: bytes) -> list[Message]:
        framed = self._framed(data)
        for m in reversed(framed):
            if m.kind == b"Z":
                if len(m.raw) > 5:
                    self.transaction_status = chr(m.raw[5])
                break
        return framed

    def feed_chunk(self, data: bytes) -> tuple[bytes, list[int]]:
        """As :meth:`feed`, without a :class:`Message` per message: the whole messages
        as one run of bytes and where each starts (see :meth:`_chunk`)."""
        chunk, starts = self._chunk(data)
        for at in reversed(starts):
            if chunk[at] == _READY:
                self.transaction_status = ready_status(chunk, at) or self.transaction_status
                break
        return chunk, starts


def message(kind: bytes, body: bytes) -> bytes:
    return kind + _LENGTH.pack(len(body) + 4) + body


def cstring(data: bytes, at: int = 0) -> tuple[str, int]:
    """A NUL-terminated string at ``at``: (text, offset after the NUL)."""
    end = data.find(b"\0", at)
    if end < 0:
        raise ProtocolError("unterminated string")
    return data[at:end].decode(errors="replace"), end + 1
