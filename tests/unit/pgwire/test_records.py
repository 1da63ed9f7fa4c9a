"""The sidecar's own requests: which prepared statements a failed one leaves behind."""

from __future__ import annotations

from sidecar.pgwire import messages, records
from sidecar.pgwire.codec import BackendReader, Message


def _answers(*raw: bytes) -> list[Message]:
    return BackendReader().feed(b"".join(raw))


PARSED, BOUND, CLOSED = b"1\0\0\0\x04", b"2\0\0\0\x04", b"3\0\0\0\x04"
IDLE, FAILED = messages.ready_for_query("I"), messages.ready_for_query("E")
NO_ROOM = messages.error_response("53100", "no room")


def test_a_request_that_succeeded_leaves_nothing_to_close() -> None:
    record = records.request("SELECT 1", [], sync=True)
    answers = _answers(PARSED, BOUND, messages.command_complete("SELECT 1"), CLOSED, CLOSED, IDLE)
    assert records.failed_closes(record, answers) == []


def test_a_failed_request_leaves_its_close_messages() -> None:
    record = records.request("SELECT 1", [], sync=True)
    answers = _answers(PARSED, BOUND, NO_ROOM, FAILED)  # the server skipped to Sync
    assert records.failed_closes(record, answers) == records.closes(record)
    assert [m[:1] for m in records.failed_closes(record, answers)] == [b"C", b"C"]


def test_only_the_failed_request_of_several_leaves_its_close_messages() -> None:
    """A record that went through, then the agent's statement that failed: the record's
    Close messages ran, nothing is left to close."""
    record = records.request("SELECT 1", [], sync=True)
    statement = messages.query("INSERT INTO t VALUES (1)")
    completion = records.request("SELECT 2", [], sync=True)
    answers = _answers(
        PARSED, BOUND, messages.command_complete("SELECT 1"), CLOSED, CLOSED, IDLE,
        NO_ROOM, IDLE,
    )  # fmt: skip
    assert records.failed_closes([*record, statement], answers) == []
    answers = _answers(
        messages.command_complete("INSERT 0 1"), IDLE, PARSED, BOUND, NO_ROOM, FAILED
    )
    assert records.failed_closes([statement, *completion], answers) == records.closes(completion)
