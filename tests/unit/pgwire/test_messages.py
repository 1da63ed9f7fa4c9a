"""The messages the sidecar reads and writes: built bytes decode back to what was meant."""

from __future__ import annotations

import struct

import pytest

from sidecar.pgwire import messages
from sidecar.pgwire.codec import BackendReader, FrontendReader, Message, ProtocolError, message


def _frontend(raw: bytes) -> Message:
    (m,) = FrontendReader().feed(raw)
    return m


def _backend(raw: bytes) -> Message:
    (m,) = BackendReader().feed(raw)
    return m


def _body(kind: bytes, body: bytes) -> Message:
    return Message(kind, body, message(kind, body))


def _bind_body(
    portal: bytes,
    statement: bytes,
    formats: list[int],
    parameters: list[bytes | None],
    results: list[int],
) -> bytes:
    """A Bind body laid out field by field as the protocol documentation has it."""
    body = portal + b"\0" + statement + b"\0"
    body += struct.pack("!h", len(formats)) + b"".join(struct.pack("!h", f) for f in formats)
    body += struct.pack("!h", len(parameters))
    for value in parameters:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    body += struct.pack("!h", len(results)) + b"".join(struct.pack("!h", f) for f in results)
    return body


# ---- frontend --------------------------------------------------------------------------


def test_a_query_decodes_to_its_sql_text():
    m = _frontend(messages.query("SELECT 'ü'; SELECT 2"))
    assert m.kind == b"Q"
    assert messages.query_text(m) == "SELECT 'ü'; SELECT 2"


def test_parse_round_trips_statement_name_and_sql():
    raw = messages.parse_message("stmt_1", "INSERT INTO t VALUES ($1, $2)")
    m = _frontend(raw)
    assert m.kind == b"P"
    assert messages.parse(m) == messages.Parse("stmt_1", "INSERT INTO t VALUES ($1, $2)")
    assert raw.endswith(b"\0\0\0")  # no parameter types declared


def test_parse_of_the_unnamed_statement_with_declared_parameter_types():
    body = b"\0SELECT $1\0" + struct.pack("!hi", 1, 23)  # one parameter, int4
    assert messages.parse(_body(b"P", body)) == messages.Parse("", "SELECT $1")


def test_bind_built_by_the_sidecar_decodes_to_text_parameters_and_nulls():
    raw = messages.bind_message("portal", "stmt", [b"42", None, b"", "ü".encode()])
    bind = messages.bind(_frontend(raw))
    assert bind == messages.Bind(
        portal="portal",
        statement="stmt",
        parameters=(b"42", None, b"", "ü".encode()),
        parameter_formats=(),
        result_formats=(),
    )


def test_bind_with_binary_parameters_and_per_column_formats():
    int4 = struct.pack("!i", -7)
    body = _bind_body(b"p", b"s", [1, 0, 1], [int4, b"text", None], [0, 1])
    bind = messages.bind(_body(b"B", body))
    assert bind.parameters == (int4, b"text", None)
    assert bind.parameter_formats == (1, 0, 1)
    assert bind.result_formats == (0, 1)
    assert (bind.portal, bind.statement) == ("p", "s")


def test_bind_with_one_format_for_all_parameters_keeps_the_single_code():
    body = _bind_body(b"", b"", [1], [b"\0\0\0\x01", b"\0\0\0\x02"], [1])
    bind = messages.bind(_body(b"B", body))
    assert bind.parameter_formats == (1,)
    assert bind.parameters == (b"\0\0\0\x01", b"\0\0\0\x02")
    assert bind.result_formats == (1,)


def test_a_binary_parameter_may_hold_nul_bytes_and_is_kept_exactly():
    value = bytes(range(256))
    body = _bind_body(b"", b"s", [1], [value], [])
    assert messages.bind(_body(b"B", body)).parameters == (value,)


def test_a_bind_parameter_length_below_minus_one_is_a_protocol_error():
    body = b"\0s\0" + struct.pack("!hhi", 0, 1, -2) + struct.pack("!h", 0)
    with pytest.raises(ProtocolError):
        messages.bind(_body(b"B", body))


def test_a_bind_parameter_longer_than_the_message_is_a_protocol_error():
    body = b"\0s\0" + struct.pack("!hhi", 0, 1, 100) + b"short" + struct.pack("!h", 0)
    with pytest.raises(ProtocolError, match="runs past"):
        messages.bind(_body(b"B", body))


def test_execute_round_trips_portal_and_row_limit():
    m = _frontend(messages.execute_message("portal_9"))
    assert m.kind == b"E"
    assert messages.execute(m) == messages.Execute("portal_9", 0)
    limited = _body(b"E", b"cur\0" + struct.pack("!i", 50))
    assert messages.execute(limited) == messages.Execute("cur", 50)


@pytest.mark.parametrize("target", ["S", "P"])
def test_describe_names_a_statement_or_a_portal(target):
    m = _frontend(message(b"D", target.encode() + b"name\0"))
    assert messages.describe(m) == messages.Describe(target, "name")


@pytest.mark.parametrize("target", ["S", "P"])
def test_close_round_trips_target_and_name(target):
    m = _frontend(messages.close_message(target, "x_1"))
    assert m.kind == b"C"
    assert messages.close(m) == messages.Close(target, "x_1")


def test_sync_and_flush_are_empty_messages_of_their_type():
    assert messages.SYNC == b"S\0\0\0\x04"
    assert messages.FLUSH == b"H\0\0\0\x04"


# ---- backend ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["I", "T", "E"])
def test_ready_for_query_round_trips_the_transaction_status(status):
    m = _backend(messages.ready_for_query(status))
    assert m.kind == b"Z"
    assert messages.ready_status(m) == status


def test_command_complete_round_trips_its_tag():
    m = _backend(messages.command_complete("INSERT 0 3"))
    assert messages.command_tag(m) == "INSERT 0 3"


def test_the_fixed_answers_are_empty_messages_of_their_type():
    assert (messages.PARSE_COMPLETE, messages.BIND_COMPLETE, messages.NO_DATA) == (
        b"1\0\0\0\x04",
        b"2\0\0\0\x04",
        b"n\0\0\0\x04",
    )


def test_an_error_response_carries_severity_sqlstate_message_and_detail():
    m = _backend(messages.error_response("23505", "duplicate key", "Key (id)=(1) exists."))
    assert m.kind == b"E"
    assert messages.error_fields(m) == {
        "S": "ERROR",
        "V": "ERROR",
        "C": "23505",
        "M": "duplicate key",
        "D": "Key (id)=(1) exists.",
    }
    assert m.body.endswith(b"\0\0")


def test_a_fatal_error_response_says_fatal_in_both_severity_fields():
    raw = messages.error_response("08P01", "invalid message", severity="FATAL")
    fields = messages.error_fields(_backend(raw))
    assert fields == {"S": "FATAL", "V": "FATAL", "C": "08P01", "M": "invalid message"}


def test_error_fields_reads_a_real_server_error_with_unknown_field_codes():
    body = (
        b'SERROR\0VERROR\0C42P01\0Mrelation "nope" does not exist\0P15\0'
        b"Fparse_relation.c\0L1449\0RparserOpenTable\0\0"
    )
    fields = messages.error_fields(_body(b"E", body))
    assert fields["C"] == "42P01"
    assert fields["M"] == 'relation "nope" does not exist'
    assert fields["P"] == "15"
    assert fields["R"] == "parserOpenTable"


def test_error_fields_of_an_empty_error_is_empty():
    assert messages.error_fields(_body(b"E", b"\0")) == {}
    assert messages.error_fields(_body(b"E", b"")) == {}


def test_data_row_values_with_nulls_empties_and_binary():
    body = struct.pack("!h", 4)
    for value in [b"1", None, b"", b"\0\xff"]:
        body += struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value
    assert messages.data_row_values(_body(b"D", body)) == [b"1", None, b"", b"\0\xff"]


def test_a_data_row_of_no_columns_has_no_values():
    assert messages.data_row_values(_body(b"D", b"\0\0")) == []


def test_a_data_row_value_past_the_end_is_a_protocol_error_not_a_short_value():
    body = struct.pack("!hi", 1, 10) + b"abc"
    with pytest.raises(ProtocolError):
        messages.data_row_values(_body(b"D", body))


def test_backend_key_data_gives_process_id_and_secret():
    m = _backend(message(b"K", struct.pack("!ii", 31337, -2)))
    assert messages.backend_key(m) == (31337, -2)


@pytest.mark.parametrize(("code", "extra"), [(0, b""), (3, b""), (5, b"salt"), (10, b"x\0\0")])
def test_auth_code_reads_the_authentication_request_type(code, extra):
    assert messages.auth_code(_backend(message(b"R", struct.pack("!i", code) + extra))) == code


def test_auth_code_of_a_body_too_short_is_minus_one():
    assert messages.auth_code(_body(b"R", b"\0\0")) == -1


def test_sasl_offer_round_trips_the_mechanism_list():
    raw = messages.sasl_offer(["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"])
    assert raw == message(b"R", struct.pack("!i", 10) + b"SCRAM-SHA-256\0SCRAM-SHA-256-PLUS\0\0")
    m = _backend(raw)
    assert messages.auth_code(m) == 10
    assert messages.sasl_mechanisms(m) == ["SCRAM-SHA-256", "SCRAM-SHA-256-PLUS"]


def test_a_sasl_offer_with_a_mechanism_removed_keeps_the_others_in_order():
    offered = messages.sasl_mechanisms(_backend(messages.sasl_offer(["A", "B-PLUS", "C"])))
    rebuilt = messages.sasl_offer([n for n in offered if n != "B-PLUS"])
    assert messages.sasl_mechanisms(_backend(rebuilt)) == ["A", "C"]


def test_a_sasl_mechanism_that_is_not_utf8_is_a_protocol_error():
    m = _body(b"R", struct.pack("!i", 10) + b"SCRAM\xff\0\0")
    with pytest.raises(ProtocolError):
        messages.sasl_mechanisms(m)


# ---- truncation: always a ProtocolError, never struct.error or IndexError ---------------

FULL_BODIES = [
    ("bind", _bind_body(b"p", b"s", [1, 0], [b"\0\0\0\x07", None], [1])),
    ("bind", messages.bind_message("", "s", [b"x", b"yy"])[5:]),
    ("execute", messages.execute_message("portal")[5:]),
    ("describe", b"Sname\0"),
    ("close", messages.close_message("P", "c")[5:]),
    ("data_row_values", struct.pack("!hi", 2, 3) + b"abc" + struct.pack("!i", -1)),
    ("backend_key", struct.pack("!ii", 1, 2)),
    ("query_text", b"SELECT 1\0"),
    ("command_tag", b"SELECT 1\0"),
]


@pytest.mark.parametrize(("decoder", "body"), FULL_BODIES)
def test_every_truncation_of_a_message_body_is_a_protocol_error(decoder, body):
    decode = getattr(messages, decoder)
    decode(_body(b"?", body))  # the whole body decodes
    for cut in range(len(body)):
        with pytest.raises(ProtocolError):
            decode(_body(b"?", body[:cut]))


def test_a_parse_cut_before_its_sql_ends_is_a_protocol_error():
    body = messages.parse_message("s", "SELECT 1")[5:]
    for cut in range(len(b"s\0SELECT 1")):
        with pytest.raises(ProtocolError):
            messages.parse(_body(b"P", body[:cut]))


def test_an_error_response_cut_inside_a_field_is_a_protocol_error():
    body = messages.error_response("23505", "duplicate key")[5:]
    for cut in range(1, len(body)):
        if body[cut - 1] == 0:
            continue  # cut right after a field: the fields so far are well formed
        with pytest.raises(ProtocolError):
            messages.error_fields(_body(b"E", body[:cut]))
