"""Which request each server message answers: the outstanding-request queue."""

from __future__ import annotations

from sidecar.pgwire import messages
from sidecar.pgwire.codec import BackendReader, Message, message
from sidecar.pgwire.tracker import Pending, Tracker


def _server(*raws: bytes) -> list[Message]:
    return BackendReader().feed(b"".join(raws))


ROW_DESCRIPTION = message(b"T", b"\0\x01n\0" + b"\0" * 18)
DATA_ROW = message(b"D", b"\0\x01\0\0\0\x011")
NOTICE = message(b"N", b"SNOTICE\0VNOTICE\0C00000\0Mhello\0\0")
NOTIFICATION = message(b"A", b"\0\0\0\x07channel\0payload\0")
PARAMETER_STATUS = message(b"S", b"TimeZone\0UTC\0")
PARAMETER_DESCRIPTION = message(b"t", b"\0\x01\0\0\0\x17")
CLOSE_COMPLETE = message(b"3", b"")
ERROR = messages.error_response("42P01", 'relation "nope" does not exist')
ERROR_DEFERRED_FK = messages.error_response("23503", "violates foreign key constraint")


def _answers(tracker: Tracker, *raws: bytes) -> list[tuple[bytes, bytes | None]]:
    """(server message type, client request type it was attributed to) for each message."""
    out: list[tuple[bytes, bytes | None]] = []
    for m in _server(*raws):
        pending = tracker.received(m)
        out.append((m.kind, pending.kind if pending is not None else None))
    return out


def _kinds(tracker: Tracker) -> list[bytes]:
    return [p.kind for p in tracker.queue]


def test_a_simple_query_owns_every_message_through_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    got = _answers(
        tracker,
        ROW_DESCRIPTION,
        DATA_ROW,
        DATA_ROW,
        messages.command_complete("SELECT 2"),
        messages.ready_for_query("I"),
    )
    assert got == [(b"T", b"Q"), (b"D", b"Q"), (b"D", b"Q"), (b"C", b"Q"), (b"Z", b"Q")]
    assert tracker.idle


def test_a_multi_statement_query_is_answered_only_at_the_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    tracker.sent(b"Q", ours=True)
    _answers(tracker, messages.command_complete("INSERT 0 1"), messages.command_complete("COMMIT"))
    assert _kinds(tracker) == [b"Q", b"Q"]
    (first,) = [tracker.received(m) for m in _server(messages.ready_for_query("I"))]
    assert first is not None
    assert not first.ours
    assert _kinds(tracker) == [b"Q"]
    assert tracker.queue[0].ours


def test_an_error_in_a_simple_query_waits_for_its_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    tracker.sent(b"Q", ours=True)
    got = _answers(tracker, ERROR, messages.ready_for_query("I"))
    assert got == [(b"E", b"Q"), (b"Z", b"Q")]
    assert len(tracker.queue) == 1
    assert tracker.queue[0].ours  # the next query is still owed its answer


def test_a_pipelined_extended_query_pairs_each_answer_with_its_request():
    tracker = Tracker()
    for kind in [b"P", b"B", b"D", b"E", b"S"]:
        tracker.sent(kind, ours=False)
    got = _answers(
        tracker,
        messages.PARSE_COMPLETE,
        messages.BIND_COMPLETE,
        ROW_DESCRIPTION,
        DATA_ROW,
        messages.command_complete("SELECT 1"),
        messages.ready_for_query("I"),
    )
    assert got == [
        (b"1", b"P"),
        (b"2", b"B"),
        (b"T", b"D"),
        (b"D", b"E"),
        (b"C", b"E"),
        (b"Z", b"S"),
    ]
    assert tracker.idle


def test_describe_of_a_statement_ends_at_no_data_after_its_parameter_description():
    tracker = Tracker()
    for kind in [b"P", b"D", b"S"]:
        tracker.sent(kind, ours=False)
    got = _answers(
        tracker,
        messages.PARSE_COMPLETE,
        PARAMETER_DESCRIPTION,
        messages.NO_DATA,
        messages.ready_for_query("I"),
    )
    assert got == [(b"1", b"P"), (b"t", b"D"), (b"n", b"D"), (b"Z", b"S")]
    assert tracker.idle


def test_execute_ends_at_an_empty_query_or_a_suspended_portal():
    tracker = Tracker()
    for kind in [b"E", b"E", b"C", b"S"]:
        tracker.sent(kind, ours=False)
    got = _answers(
        tracker,
        message(b"I", b""),
        DATA_ROW,
        message(b"s", b""),
        CLOSE_COMPLETE,
        messages.ready_for_query("T"),
    )
    assert got == [(b"I", b"E"), (b"D", b"E"), (b"s", b"E"), (b"3", b"C"), (b"Z", b"S")]
    assert tracker.idle


def test_an_error_in_the_extended_protocol_drops_the_requests_up_to_the_sync():
    tracker = Tracker()
    for kind in [b"P", b"B", b"E", b"C", b"S", b"P", b"S"]:
        tracker.sent(kind, ours=False)
    failed = tracker.received(_server(ERROR)[0])
    assert failed is not None
    assert failed.kind == b"P"
    assert _kinds(tracker) == [b"S", b"P", b"S"]  # Bind, Execute and Close get no answer
    got = _answers(
        tracker,
        messages.ready_for_query("I"),
        messages.PARSE_COMPLETE,
        messages.ready_for_query("I"),
    )
    assert got == [(b"Z", b"S"), (b"1", b"P"), (b"Z", b"S")]
    assert tracker.idle


def test_an_error_mid_run_is_attributed_to_the_request_that_failed():
    tracker = Tracker()
    for kind in [b"P", b"B", b"E", b"S"]:
        tracker.sent(kind, ours=False)
    got = _answers(
        tracker,
        messages.PARSE_COMPLETE,
        messages.BIND_COMPLETE,
        ERROR,
        messages.ready_for_query("I"),
    )
    assert got == [(b"1", b"P"), (b"2", b"B"), (b"E", b"E"), (b"Z", b"S")]
    assert tracker.idle


def test_an_error_answering_sync_leaves_the_next_pipelined_run_queued():
    # A COMMIT failing at Sync (a deferred foreign key, as PostgreSQL reports it):
    # 1 2 C | E Z for the first run, then 1 2 D C Z for the second.
    tracker = Tracker()
    for kind in [b"P", b"B", b"E", b"S"]:
        tracker.sent(kind, ours=False)
    for kind in [b"P", b"B", b"E", b"S"]:
        tracker.sent(kind, ours=True)
    got = _answers(
        tracker,
        messages.PARSE_COMPLETE,
        messages.BIND_COMPLETE,
        messages.command_complete("INSERT 0 1"),
        ERROR_DEFERRED_FK,
        messages.ready_for_query("I"),
    )
    assert got == [(b"1", b"P"), (b"2", b"B"), (b"C", b"E"), (b"E", b"S"), (b"Z", b"S")]
    assert _kinds(tracker) == [b"P", b"B", b"E", b"S"]
    assert all(p.ours for p in tracker.queue)
    second = [tracker.received(m) for m in _server(messages.PARSE_COMPLETE, DATA_ROW)]
    assert all(p is not None and p.ours for p in second)


def test_notices_notifications_and_parameter_changes_do_not_end_a_request():
    tracker = Tracker()
    for kind in [b"P", b"S"]:
        tracker.sent(kind, ours=True)
    got = _answers(tracker, NOTICE, NOTIFICATION, PARAMETER_STATUS)
    assert got == [(b"N", b"P"), (b"A", b"P"), (b"S", b"P")]
    assert _kinds(tracker) == [b"P", b"S"]
    _answers(tracker, messages.PARSE_COMPLETE, NOTICE)
    assert _kinds(tracker) == [b"S"]


def test_async_messages_inside_a_simple_query_stay_with_it():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    got = _answers(tracker, NOTICE, PARAMETER_STATUS, messages.command_complete("SET"))
    assert got == [(b"N", b"Q"), (b"S", b"Q"), (b"C", b"Q")]
    assert _kinds(tracker) == [b"Q"]


def test_a_message_with_nothing_outstanding_is_unsolicited():
    tracker = Tracker()
    assert [tracker.received(m) for m in _server(NOTIFICATION, PARAMETER_STATUS)] == [None, None]
    assert tracker.idle


def test_requests_that_get_no_answer_are_not_queued():
    tracker = Tracker()
    for kind in [b"H", b"d", b"c", b"f", b"X", b"p"]:
        tracker.sent(kind, ours=False)
    assert tracker.idle


def test_the_sidecars_requests_are_told_apart_from_the_agents():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    tracker.sent(b"P", ours=True)
    tracker.sent(b"S", ours=True)
    tracker.sent(b"Q", ours=False)
    answered: list[Pending | None] = [
        tracker.received(m)
        for m in _server(
            messages.command_complete("BEGIN"),
            messages.ready_for_query("T"),
            messages.PARSE_COMPLETE,
            messages.ready_for_query("T"),
            messages.command_complete("SELECT 0"),
            messages.ready_for_query("T"),
        )
    ]
    assert [(p.kind, p.ours) for p in answered if p is not None] == [
        (b"Q", False),
        (b"Q", False),
        (b"P", True),
        (b"S", True),
        (b"Q", False),
        (b"Q", False),
    ]
    assert tracker.idle


def test_only_extended_protocol_requests_are_marked_extended():
    tracker = Tracker()
    for kind in [b"Q", b"F", b"P", b"B", b"D", b"E", b"C", b"S"]:
        tracker.sent(kind, ours=False)
    assert [(p.kind, p.extended) for p in tracker.queue] == [
        (b"Q", False),
        (b"F", False),
        (b"P", True),
        (b"B", True),
        (b"D", True),
        (b"E", True),
        (b"C", True),
        (b"S", True),
    ]


def test_the_transaction_status_follows_each_ready_for_query():
    tracker = Tracker()
    assert tracker.status == "I"
    statuses = []
    for status in ["T", "E", "I"]:
        tracker.sent(b"Q", ours=False)
        _answers(tracker, messages.command_complete("X"), messages.ready_for_query(status))
        statuses.append(tracker.status)
    assert statuses == ["T", "E", "I"]


def test_the_status_is_not_changed_by_messages_other_than_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    _answers(tracker, messages.command_complete("BEGIN"), messages.ready_for_query("T"))
    tracker.sent(b"Q", ours=False)
    _answers(tracker, ERROR)
    assert tracker.status == "T"


def test_a_function_call_is_answered_through_its_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"F", ours=False)
    got = _answers(tracker, message(b"V", b"\0\0\0\x011"), messages.ready_for_query("I"))
    assert got == [(b"V", b"F"), (b"Z", b"F")]
    assert tracker.idle


def test_copy_from_stdin_stays_inside_its_query_until_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    copy_in = message(b"G", b"\0\0\x01\0\0")
    assert _answers(tracker, copy_in) == [(b"G", b"Q")]
    for kind in [b"d", b"d", b"c"]:  # CopyData, CopyData, CopyDone from the client
        tracker.sent(kind, ours=False)
    assert _kinds(tracker) == [b"Q"]
    got = _answers(tracker, messages.command_complete("COPY 2"), messages.ready_for_query("I"))
    assert got == [(b"C", b"Q"), (b"Z", b"Q")]
    assert tracker.idle


def test_copy_to_stdout_streams_inside_its_query_until_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    tracker.sent(b"Q", ours=True)
    got = _answers(
        tracker,
        message(b"H", b"\0\0\x01\0\0"),  # CopyOutResponse
        message(b"d", b"1\tone\n"),
        message(b"d", b"2\ttwo\n"),
        message(b"c", b""),  # CopyDone
        messages.command_complete("COPY 2"),
        messages.ready_for_query("I"),
    )
    assert got == [(kind, b"Q") for kind in [b"H", b"d", b"d", b"c", b"C", b"Z"]]
    assert [p.ours for p in tracker.queue] == [True]


def test_a_failed_copy_from_stdin_ends_with_the_error_and_ready_for_query():
    tracker = Tracker()
    tracker.sent(b"Q", ours=False)
    _answers(tracker, message(b"G", b"\0\0\0"))
    tracker.sent(b"f", ours=False)  # CopyFail
    got = _answers(tracker, ERROR, messages.ready_for_query("I"))
    assert got == [(b"E", b"Q"), (b"Z", b"Q")]
    assert tracker.idle
