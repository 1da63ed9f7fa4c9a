"""The sidecar's own table in the agent's database, and the requests that read and write it.

``effect_sidecar.effects`` holds one row per recorded statement of a task: inserted in
the same transaction as the statement (so both commit or neither does), completed with
the statement's command tag and any rows it returned, read back to answer a replay.

The requests go by the extended protocol with parameters, under statement and portal
names of the sidecar's own that are closed after use, so they never disturb the agent's
prepared statements or its unnamed statement.  Each ends with Sync (a request of its own,
outside or inside a transaction) or Flush (slipped in among the agent's extended-protocol
messages, where a Sync would end the agent's implicit transaction).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from sidecar.domain.model import RecordedResponse
from sidecar.pgwire import messages
from sidecar.pgwire.codec import Message
from sidecar.pgwire.session import SKIPPED

# Asked first: when the table exists (every start but the first), the locked creation
# below is skipped.  It runs in the agent's transaction, so its advisory lock would be held
# until that transaction ends: one stalled agent (or a frozen sidecar) in the middle of a
# transaction would stop every other sidecar's first statement on this database.
SCHEMA_EXISTS = "SELECT to_regclass('effect_sidecar.effects') IS NOT NULL"
SCHEMA = (
    "SELECT pg_advisory_xact_lock(7301729000)",
    "CREATE SCHEMA IF NOT EXISTS effect_sidecar",
    "CREATE TABLE IF NOT EXISTS effect_sidecar.effects ("
    " task text NOT NULL, key text NOT NULL, attempt_id text NOT NULL,"
    " generation integer NOT NULL, statement text NOT NULL, command_tag text,"
    " row_description bytea, data_rows bytea, recorded_at timestamptz NOT NULL DEFAULT now(),"
    " PRIMARY KEY (task, key))",
)
RECORD = (
    "INSERT INTO effect_sidecar.effects (task, key, attempt_id, generation, statement)"
    " VALUES ($1, $2, $3, $4::integer, $5) ON CONFLICT (task, key) DO NOTHING RETURNING 1"
)
# RECORD for a statement sent right behind it, in a transaction of the sidecar's own: a
# record already there fails the transaction (unique_violation), and with it the
# statement, which the server then skips - so the two can travel together.
RECORD_OR_FAIL = (
    "INSERT INTO effect_sidecar.effects (task, key, attempt_id, generation, statement)"
    " VALUES ($1, $2, $3, $4::integer, $5)"
)
COMPLETE = (
    "UPDATE effect_sidecar.effects SET command_tag = $3, row_description = $4::bytea,"
    " data_rows = $5::bytea WHERE task = $1 AND key = $2"
)
RECALL = (
    "SELECT command_tag, row_description, data_rows FROM effect_sidecar.effects"
    " WHERE task = $1 AND key = $2"
)
# Fails the transaction it runs in, as any server error would, with the sidecar's SQLSTATE.
REFUSED = (
    "DO $$BEGIN RAISE EXCEPTION USING ERRCODE = 'ES409', "
    "MESSAGE = 'refused by effect-sidecar'; END$$"
)
UNDEFINED_TABLE = "42P01"
UNIQUE_VIOLATION = "23505"
_names = itertools.count(1)


class Skipped(Exception):
    """The server skipped the sidecar's request (an earlier message of the batch failed)."""


class Refused(Exception):
    """The statement must not run: its answer to the agent is an ErrorResponse.
    ``by_server``: the server failed a request of the sidecar's own, so the transaction
    is failed already (and in the extended protocol, the server skips every message up
    to the next Sync)."""

    def __init__(self, code: str, text: str, *, by_server: bool = False) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.by_server = by_server


@dataclass(frozen=True, slots=True)
class Recalled:
    """A recorded statement's answer."""

    tag: str
    row_description: bytes
    data_rows: bytes

    def answer(self, *, simple: bool) -> bytes:
        """As the agent's protocol expects it: a simple Query gets the RowDescription too;
        an Execute does not (its Describe was answered by the server already)."""
        head = self.row_description if simple else b""
        return head + self.data_rows + messages.command_complete(self.tag)


def request(sql: str, values: list[str], *, sync: bool) -> list[bytes]:
    name = f"__effect_sidecar_{next(_names)}"
    return [
        messages.parse_message(name, sql),
        messages.bind_message(name, name, [v.encode() for v in values]),
        messages.execute_message(name),
        messages.close_message("P", name),
        messages.close_message("S", name),
        messages.SYNC if sync else messages.FLUSH,
    ]


def closes(request: Iterable[bytes]) -> list[bytes]:
    """The Close messages of ``request``: sent again after it failed, since the server
    skipped them (a statement prepared by Parse outlives the transaction that failed)."""
    return [message for message in request if message[:1] == b"C"]


def failed_closes(sent: Iterable[bytes], answers: list[Message]) -> list[bytes]:
    """The Close messages of those requests in ``sent`` that the server failed, each
    request ending with a Sync or being a Query (the simple protocol), each answered up
    to its ReadyForQuery."""
    found: list[bytes] = []
    request: list[bytes] = []
    start = 0
    for raw in sent:
        request.append(raw)
        if raw[:1] not in (b"S", b"Q"):
            continue
        end = next((i for i in range(start, len(answers)) if answers[i].kind == b"Z"), None)
        if end is None:
            break
        if b"E" in [a.kind for a in answers[start:end]]:
            found += closes(request)
        request, start = [], end + 1
    return found


def record_values(task: str, key: str, attempt_id: str, generation: int, text: str) -> list[str]:
    return [task, key, attempt_id, str(generation), text]


def complete_values(task: str, key: str, tag: str, description: bytes, rows: bytes) -> list[str]:
    return [task, key, tag, _bytea(description), _bytea(rows)]


def is_new(answers: list[Message]) -> bool:
    """Whether RECORD inserted its row (the statement must run) - after raise_on_error."""
    return b"D" in [a.kind for a in answers]


def already_recorded(answers: list[Message]) -> bool:
    """Whether RECORD_OR_FAIL failed because the statement's record is there already."""
    for answer in answers:
        if answer.kind == b"E":
            fields = messages.error_fields(answer)
            return (
                fields.get("C") == UNIQUE_VIOLATION
                and fields.get("s") == "effect_sidecar"
                and fields.get("t") == "effects"
            )
    return False


def schema_exists(answers: list[Message]) -> bool:
    """SCHEMA_EXISTS's answer - after raise_on_error."""
    row = next((messages.data_row_values(a) for a in answers if a.kind == b"D"), [b"f"])
    return row[0] == b"t"


def recalled(answers: list[Message]) -> Recalled:
    row = next(messages.data_row_values(a) for a in answers if a.kind == b"D")
    return Recalled((row[0] or b"").decode(), _unbytea(row[1]), _unbytea(row[2]))


def lost_table(answers: list[Message]) -> bool:
    """The table is gone (dropped behind the sidecar's back, or the database re-created)."""
    return any(
        messages.error_fields(a).get("C") == UNDEFINED_TABLE for a in answers if a.kind == b"E"
    )


def raise_on_error(answers: list[Message], what: str) -> None:
    """Skipped if the server skipped the request (wherever that shows), else Refused
    with the first error - looked for in one pass: three go by per recorded statement."""
    failed: Message | None = None
    for answer in answers:
        kind = answer.kind
        if kind == SKIPPED:
            raise Skipped(what)
        if kind == b"E" and failed is None:
            failed = answer
    if failed is not None:
        raise Refused("ES500", f"effect-sidecar: {what}: {error_text([failed])}", by_server=True)


def error_text(answers: list[Message]) -> str:
    for answer in answers:
        if answer.kind == b"E":
            fields = messages.error_fields(answer)
            return f"{fields.get('C', '')} {fields.get('M', '')}".strip()
    return ""


def command_tag(answers: list[Message]) -> str:
    return next((messages.command_tag(a) for a in answers if a.kind == b"C"), "")


def as_response(tag: str) -> RecordedResponse:
    """A command tag as the effect log keeps answers (HTTP-shaped: 200 and a header)."""
    return RecordedResponse(200, (("x-command-tag", tag),))


def _bytea(data: bytes) -> str:
    return "\\x" + data.hex()


def _unbytea(value: bytes | None) -> bytes:
    if not value:
        return b""
    text = value.decode()
    return bytes.fromhex(text[2:]) if text.startswith("\\x") else b""
