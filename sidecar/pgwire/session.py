"""One agent connection after start-up: relay, track, and hand guarded statements over.

Two loops share the connection.  The client loop reads the agent's messages, keeps the
prepared-statement and portal maps (a statement prepared once and executed later still
maps to its SQL), and forwards everything no rule concerns as soon as it arrives.  When
a message would execute a statement a rule matches, the client loop hands that request
to the :class:`~sidecar.pgwire.exactly_once.Statements` engine, which may inject
messages of its own.  The server loop attributes every server message to its request
(:class:`~sidecar.pgwire.tracker.Tracker`): the agent's answers are relayed, the
sidecar's own go to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.pgwire import messages
from sidecar.pgwire.codec import BackendReader, FrontendReader, Message
from sidecar.pgwire.tracker import Tracker

log = logging.getLogger("sidecar.pgwire")

READ_SIZE = 1 << 16
#: Delivered to the engine when an error made the server skip its pending requests.
SKIPPED = b"!"


@dataclass
class Prepared:
    sql: str
    guarded: bool


@dataclass
class Portal:
    statement: Prepared
    bind: messages.Bind | None


class Engine(Protocol):
    """What the session asks of the exactly-once engine (None: no rules for SQL)."""

    def guards(self, sql: str) -> bool:
        """Whether any statement of ``sql`` is one a rule records."""
        ...

    async def simple(self, conversation: Conversation, sql: str, raw: bytes) -> None:
        """Run a simple Query holding a guarded statement; answer the agent."""
        ...

    async def execute(self, conversation: Conversation, portal: Portal, raw: bytes) -> None:
        """Run an Execute of a guarded statement (extended protocol); answer the agent."""
        ...

    def ready(self, status: str, committed: bool) -> None:
        """A ReadyForQuery went by: ``status``, and whether a transaction just committed."""
        ...


@dataclass
class Conversation:
    """The two halves of one connection, as the engine sees them."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tracker: Tracker
    # Answers to the sidecar's own requests, each with "was that the last one owed".
    ours: asyncio.Queue[tuple[Message, bool]] = field(default_factory=asyncio.Queue)
    became_idle: asyncio.Event = field(default_factory=asyncio.Event)
    # Told at every ReadyForQuery: the status, and whether a transaction just committed.
    on_ready: Callable[[str, bool], None] | None = None

    def send_server(self, raw: bytes, kind: bytes, *, ours: bool) -> None:
        self.tracker.sent(kind, ours=ours)
        self.server.write(raw)

    def send_client(self, raw: bytes) -> None:
        self.client.write(raw)

    async def wait_idle(self) -> None:
        """Until every request sent so far is answered (the transaction status is known)."""
        while not self.tracker.idle:
            self.became_idle.clear()
            await self.became_idle.wait()

    async def ask(self, *parts: bytes) -> list[Message]:
        """Send requests of the sidecar's own; their answers (never relayed to the agent)."""
        answerable = False
        for raw in parts:
            self.send_server(raw, raw[:1], ours=True)
            answerable = answerable or raw[:1] != b"H"
        await self.server.drain()
        answers: list[Message] = []
        while answerable:
            m, last = await self.ours.get()
            if not m.kind:
                raise ConnectionError("the PostgreSQL server closed the connection")
            answers.append(m)
            answerable = not last
        return answers


async def run_session(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    server_reader: asyncio.StreamReader,
    server_writer: asyncio.StreamWriter,
    frontend: FrontendReader,
    backend: BackendReader,
    engine: Engine | None,
) -> None:
    conversation = Conversation(client_writer, server_writer, Tracker())
    if engine is not None:
        conversation.on_ready = engine.ready
    server_task = asyncio.create_task(_server_loop(server_reader, backend, conversation))
    try:
        await _client_loop(client_reader, frontend, conversation, engine, server_task)
    finally:
        server_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError):
            await server_task
        with contextlib.suppress(Exception):
            server_writer.close()


async def _server_loop(
    reader: asyncio.StreamReader, backend: BackendReader, conversation: Conversation
) -> None:
    tracker = conversation.tracker
    errored, last_tag = False, ""
    while data := await reader.read(READ_SIZE):
        relay = bytearray()
        for m in backend.feed(data):
            owed_before = any(p.ours for p in tracker.queue)
            if m.kind == b"E":
                errored = True
            elif m.kind == b"C":
                last_tag = messages.command_tag(m)
            pending = tracker.received(m)
            owed = any(p.ours for p in tracker.queue)
            if pending is not None and pending.ours:
                conversation.ours.put_nowait((m, not owed))
            else:
                relay += m.raw
                if owed_before and not owed:
                    # The agent's error made the server skip the sidecar's requests too.
                    conversation.ours.put_nowait((Message(SKIPPED, b"", b""), True))
            if m.kind == b"Z":
                if conversation.on_ready is not None:
                    ended = tracker.status == "I"
                    conversation.on_ready(
                        tracker.status, ended and not errored and last_tag != "ROLLBACK"
                    )
                errored, last_tag = False, ""
        if relay:
            conversation.client.write(bytes(relay))
            await conversation.client.drain()
        if tracker.idle:
            conversation.became_idle.set()
    conversation.ours.put_nowait((Message(b"", b"", b""), True))  # the server went away


async def _client_loop(
    reader: asyncio.StreamReader,
    frontend: FrontendReader,
    conversation: Conversation,
    engine: Engine | None,
    server_task: asyncio.Task[None],
) -> None:
    statements: dict[str, Prepared] = {}
    portals: dict[str, Portal] = {}
    guarded = engine.guards if engine is not None else _never
    while True:
        read = asyncio.ensure_future(reader.read(READ_SIZE))
        done, _ = await asyncio.wait({read, server_task}, return_when=asyncio.FIRST_COMPLETED)
        if read not in done:
            read.cancel()
            return  # the server closed the connection
        data = read.result()
        if not data:
            return
        out = bytearray()
        for m in frontend.feed(data):
            kind = m.kind
            if kind == b"P":
                parse = messages.parse(m)
                statements[parse.name] = Prepared(parse.query, guarded(parse.query))
            elif kind == b"B":
                bind = messages.bind(m)
                # An unknown name is the server's to refuse ("prepared statement does
                # not exist"): relayed as not guarded.
                prepared = statements.get(bind.statement) or _UNKNOWN
                portals[bind.portal] = Portal(prepared, bind if prepared.guarded else None)
            elif kind == b"C":
                closed = messages.close(m)
                (statements if closed.target == "S" else portals).pop(closed.name, None)
            elif kind == b"X":
                conversation.server.write(bytes(out) + m.raw)
                return
            handler = _handler(kind, m, statements, portals, engine)
            if handler is None:
                conversation.tracker.sent(kind, ours=False)
                out += m.raw
                continue
            if out:
                conversation.server.write(bytes(out))
                out.clear()
            await handler(conversation)
        if out:
            conversation.server.write(bytes(out))
        await conversation.server.drain()
        await conversation.client.drain()


def _handler(
    kind: bytes,
    m: Message,
    statements: dict[str, Prepared],
    portals: dict[str, Portal],
    engine: Engine | None,
) -> Callable[[Conversation], Awaitable[None]] | None:
    """The engine's handler for a message that runs a guarded statement, else None."""
    if engine is None:
        return None
    if kind == b"Q":
        sql = messages.query_text(m)
        if engine.guards(sql):
            return lambda c: engine.simple(c, sql, m.raw)
    elif kind == b"E":
        portal = portals.get(messages.execute(m).portal)
        if portal is not None and portal.statement.guarded:
            return lambda c: engine.execute(c, portal, m.raw)
    return None


_UNKNOWN = Prepared("", guarded=False)


def _never(sql: str) -> bool:
    return False
