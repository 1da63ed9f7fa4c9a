"""Routes, redaction, proxy credentials, the readiness gate and which hosts get TLS opened."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import tflow

from sidecar.errors import ConfigError
from sidecar.proxy.addons import binder as binder_module
from sidecar.proxy.addons.binder import METADATA, TaskBinder
from sidecar.proxy.addons.effects import EffectAddon, to_response
from sidecar.proxy.addons.gate import ReadinessGate
from sidecar.proxy.addons.router import Router
from sidecar.proxy.embed import interception_hosts
from sidecar.proxy.exchange import AgentRequest, Answer, unsendable_header, unsendable_target
from sidecar.proxy.redact import REDACTED, request_summary
from sidecar.proxy.routes import Routes
from sidecar.recording.bindings import BindRequest
from sidecar.rules import load_rules
from sidecar.runtime.metrics import Metrics


def test_routes_send_a_host_to_its_target_and_refuse_nonsense():
    routes = Routes.parse(["API.GitHub.com=http://127.0.0.1:9000", "x.test=https://h"])
    target = routes.target("api.github.com")
    assert (target.scheme, target.host, target.port, target.authority) == (
        "http",
        "127.0.0.1",
        9000,
        "127.0.0.1:9000",
    )
    assert routes.target("x.test").authority == "h"
    for bad in ["nohost", "a=ftp://x", "a=http://x/path", "=http://x"]:
        with pytest.raises(ConfigError):
            Routes.parse([bad])


def test_the_effect_log_summary_keeps_no_secret():
    summary = request_summary(
        "POST",
        "https",
        "api.example.com",
        "/v1/things",
        "token=abc&page=2",
        [("Authorization", "Bearer x"), ("Cookie", "s=1"), ("X-Trace", "ghp_" + "a" * 36)],
        json.dumps({"name": "n", "password": "hunter2", "nested": {"api_key": "k"}}).encode(),
    )
    assert summary["url"] == "https://api.example.com/v1/things?token=%5Bredacted%5D&page=2"
    assert summary["headers"] == {
        "authorization": REDACTED,
        "cookie": REDACTED,
        "x-trace": REDACTED,
    }
    assert summary["body"] == {"name": "n", "password": REDACTED, "nested": {"api_key": REDACTED}}
    assert "hunter2" not in json.dumps(summary)


def test_secret_names_are_recognised_by_pattern_not_by_list():
    body = {
        "pwd": "p1", "passphrase": "p2", "private_key": "p3", "card": {"number": "4242"},
        "cvc": "123", "name": "kept", "keyboard": "kept",
    }  # fmt: skip
    summary = request_summary(
        "POST", "https", "h.example", "/f", "sv=2024&sig=c2lnbmF0dXJl&page=1",
        [("Ocp-Apim-Subscription-Key", "k1"), ("X-Functions-Key", "k2"), ("X-Order-Id", "7")],
        json.dumps(body).encode(),
    )  # fmt: skip
    assert summary["url"].endswith("?sv=2024&sig=%5Bredacted%5D&page=1")
    assert summary["headers"] == {
        "ocp-apim-subscription-key": REDACTED,
        "x-functions-key": REDACTED,
        "x-order-id": "7",
    }
    assert summary["body"] == {
        "pwd": REDACTED, "passphrase": REDACTED, "private_key": REDACTED, "card": REDACTED,
        "cvc": REDACTED, "name": "kept", "keyboard": "kept",
    }  # fmt: skip


def test_a_header_is_secret_by_its_name_in_any_case_on_every_request():
    for _ in range(3):  # the decision per name is remembered: it must stay the same
        for name in ("Authorization", "AUTHORIZATION", "X-Api-Key", "x-session-id"):
            summary = request_summary("GET", "https", "h.example", "/", "", [(name, "v")], None)
            assert summary["headers"] == {name.lower(): REDACTED}
        kept = request_summary("GET", "https", "h.example", "/", "", [("X-Trace", "t1")], None)
        assert kept["headers"] == {"x-trace": "t1"}


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.mark.parametrize(
    ("http_version", "host_header"),
    [(b"HTTP/1.1", "API.GitHub.com"), (b"HTTP/1.1", None), (b"HTTP/2.0", None)],
)
def test_a_routed_request_ends_as_mitmproxy_s_own_setters_would_leave_it(
    http_version: bytes, host_header: str | None
):
    router = Router(Routes.parse(["api.github.com=http://127.0.0.1:9000"]))
    routed, by_setters = tflow.tflow(), tflow.tflow()
    for flow in (routed, by_setters):
        request = flow.request
        request.http_version = http_version.decode()
        request.scheme, request.host, request.port = "https", "api.github.com", 443
        if http_version == b"HTTP/2.0":
            request.authority = "api.github.com:443"
        if host_header is None:
            request.headers.pop("Host", None)
        else:
            request.headers["Host"] = host_header
    router.requestheaders(routed)
    request = by_setters.request
    request.scheme, request.host, request.port = "http", "127.0.0.1", 9000
    request.host_header = "127.0.0.1:9000"
    assert routed.request.data == by_setters.request.data
    assert (routed.request.url, routed.request.host_header) == (
        "http://127.0.0.1:9000/path",
        "127.0.0.1:9000",
    )


def test_proxy_credentials_bind_the_connection_and_are_stripped():
    binder = TaskBinder(default_task=None)
    connect = tflow.tflow()
    connect.request.method = "CONNECT"
    connect.request.headers["Proxy-Authorization"] = _basic("312", "att-1")
    binder.http_connect(connect)
    inner = tflow.tflow()
    inner.client_conn = connect.client_conn
    inner.request.headers["X-Sidecar-Task"] = "999"
    binder.requestheaders(inner)
    bind = inner.metadata[METADATA]
    assert (bind.task, bind.attempt_id, bind.source) == ("312", "att-1", "credentials")
    assert "X-Sidecar-Task" not in inner.request.headers


def test_the_sidecar_s_own_headers_are_removed_every_time_they_appear_and_only_they():
    binder = TaskBinder(default_task=None)
    flow = tflow.tflow()
    flow.request.headers.fields = (
        (b"Host", b"api.example.com"),
        (b"x-sidecar-task", b"312"),
        (b"Accept", b"*/*"),
        (b"X-Sidecar-Task", b"313"),
        (b"Proxy-Authorization", _basic("7", "att-2").encode()),
        (b"X-Trace", b"\xff"),
    )
    binder.requestheaders(flow)
    bind = flow.metadata[METADATA]
    assert (bind.task, bind.attempt_id, bind.source) == ("7", "att-2", "credentials")
    assert flow.request.headers.fields == (
        (b"Host", b"api.example.com"),
        (b"Accept", b"*/*"),
        (b"X-Trace", b"\xff"),
    )
    named = tflow.tflow()
    named.request.headers.fields = ((b"X-Sidecar-Task", b" 312"), (b"x-sidecar-task", b"313"))
    binder.requestheaders(named)
    # Repeated, the header reads as mitmproxy joins it: the task is not guessed.
    assert named.metadata[METADATA].task == "312, 313"
    assert named.request.headers.fields == ()


def test_credentials_read_again_come_from_what_was_kept_within_its_bounds(monkeypatch):
    monkeypatch.setattr(binder_module, "_kept", {})
    monkeypatch.setattr(binder_module, "KEPT", 3)
    binder = TaskBinder(default_task=None)

    def bound(authorization: str) -> tuple[str | None, str | None, str]:
        flow = tflow.tflow()
        flow.request.headers["Proxy-Authorization"] = authorization
        binder.requestheaders(flow)
        bind = flow.metadata[METADATA]
        return bind.task, bind.attempt_id, bind.source

    for _ in range(2):  # the second time from what was kept, the same
        assert bound(_basic("312", "att-1")) == ("312", "att-1", "credentials")
        assert bound("Basic !!!") == (None, None, "none")  # not base64: no credentials
        assert bound("Bearer abc") == (None, None, "none")
    for n in range(10):
        assert bound(_basic(f"t{n}", "a")) == (f"t{n}", "a", "credentials")
    long = _basic("t", "a" * 600)
    assert bound(long) == ("t", "a" * 600, "credentials")
    assert 0 < len(binder_module._kept) <= 3
    assert long not in binder_module._kept


def test_without_credentials_the_header_then_the_default_task_binds():
    binder = TaskBinder(default_task="7")
    flow = tflow.tflow()
    flow.request.headers["X-Sidecar-Task"] = "312"
    binder.requestheaders(flow)
    assert (flow.metadata[METADATA].task, flow.metadata[METADATA].source) == ("312", "header")
    plain = tflow.tflow()
    binder.requestheaders(plain)
    assert (plain.metadata[METADATA].task, plain.metadata[METADATA].source) == ("7", "default")


def test_the_gate_answers_503_not_ready_until_opened():
    gate = ReadinessGate()
    early = tflow.tflow()
    gate.requestheaders(early)
    assert early.response.status_code == 503
    assert early.response.headers["Retry-After"] == "1"
    assert json.loads(early.response.content)["code"] == "not_ready"
    gate.open()
    later = tflow.tflow()
    gate.requestheaders(later)
    assert later.response is None


def test_tls_is_opened_only_for_hosts_an_effect_rule_or_route_concerns(tmp_path: Path):
    file = tmp_path / "r.yaml"
    file.write_text(
        "rules:\n"
        "  - {name: a, match: {host: '*.example.com', method: POST}, effect: non_idempotent}\n"
        "  - {name: b, match: {host: 'api.x.test:8443', method: POST}, effect: cache}\n"
        "  - {name: c, match: {host: reads.test}, effect: read}\n"
    )
    patterns = interception_hosts(load_rules([file]), Routes.parse(["gh.test=http://h:1"]))
    assert patterns == ["^.*\\.example\\.com:\\d+$", "^api\\.x\\.test:8443$", "^gh\\.test:\\d+$"]
    wildcard = tmp_path / "w.yaml"
    wildcard.write_text("rules:\n  - {name: w, match: {host: '*'}, effect: non_idempotent}\n")
    assert interception_hosts(load_rules([wildcard]), Routes.parse([])) is None


class _BrokenRules:
    """A rule set whose matching fails: stands in for any bug before the guard."""

    def may_match_host(self, host: str, port: int | None) -> bool:
        return True

    def match(self, facts: object) -> object:
        raise RuntimeError("matcher bug")


class _BrokenRecorder:
    async def bind(self, request: object, what: str, protocol: str) -> object:
        raise RuntimeError("binding bug")


class _BrokenGuard:
    recorder = _BrokenRecorder()


def _addon(rules: object, guard: object) -> EffectAddon:
    return EffectAddon(rules, guard, Metrics())  # type: ignore[arg-type]


def test_a_failure_while_matching_answers_500_and_never_lets_the_flow_through():
    flow = tflow.tflow()
    _addon(_BrokenRules(), None).requestheaders(flow)
    assert flow.response is not None
    assert flow.response.status_code == 500
    assert json.loads(flow.response.content)["code"] == "sidecar_error"
    assert not flow.request.stream


async def test_a_failure_while_guarding_answers_500_and_never_lets_the_flow_through(
    tmp_path: Path,
):
    file = tmp_path / "r.yaml"
    file.write_text(
        "rules:\n  - name: notes.post\n    match: {host: address, method: POST}\n"
        "    effect: non_idempotent\n"
    )
    rules = load_rules([file])
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.metadata[METADATA] = BindRequest(task="312", attempt_id=None, source="header")
    addon = _addon(rules, _BrokenGuard())
    addon.requestheaders(flow)
    assert flow.response is None, "matched, waiting for its body"
    await addon.request(flow)
    assert flow.response is not None
    assert flow.response.status_code == 500
    assert json.loads(flow.response.content)["code"] == "sidecar_error"


class _Recorder:
    async def bind(self, request: object, what: str, protocol: str) -> object:
        return "binding"


class _Guard:
    """Takes what the addon hands the effect guard, and answers 201."""

    recorder = _Recorder()

    def __init__(self) -> None:
        self.handled: list[AgentRequest] = []

    async def handle(self, binding: object, match: object, request: AgentRequest) -> Answer:
        self.handled.append(request)
        return Answer(201, (("Content-Type", "application/json"),), b"{}", "recorded")


def test_a_flow_no_rule_guards_costs_the_request_hook_no_coroutine(tmp_path: Path):
    file = tmp_path / "r.yaml"
    file.write_text(
        "rules:\n  - name: notes.post\n    match: {host: address, method: POST}\n"
        "    effect: non_idempotent\n"
    )
    addon = _addon(load_rules([file]), _Guard())
    flow = tflow.tflow()  # a GET: no rule matches
    addon.requestheaders(flow)
    assert flow.request.stream
    assert addon.request(flow) is None


async def test_the_guard_gets_the_request_as_matched_with_its_body(tmp_path: Path):
    file = tmp_path / "r.yaml"
    file.write_text(
        "rules:\n  - name: notes.post\n    match: {host: address, method: POST}\n"
        "    effect: non_idempotent\n"
    )
    flow = tflow.tflow()
    flow.request.method = "POST"
    flow.request.path = "/notes?draft=1"
    flow.request.headers["X-Trace"] = "a"
    flow.request.headers.add("X-Trace", "b")
    guard = _Guard()
    addon = _addon(load_rules([file]), guard)
    addon.requestheaders(flow)
    flow.request.content = b'{"n": 1}'  # the body arrives after the headers
    await addon.request(flow)
    assert flow.response is not None
    assert flow.response.status_code == 201
    (request,) = guard.handled
    assert (request.facts.method, request.facts.path) == ("POST", "/notes")
    assert request.facts.query == {"draft": "1"}
    assert request.facts.headers["x-trace"] == "a", "the first of repeated headers"
    assert request.facts.json_body() == {"n": 1}
    assert request.target == "/notes?draft=1"
    assert [v for n, v in request.headers if n == "X-Trace"] == ["a", "b"], "all, in order"


@pytest.mark.parametrize(
    "answer",
    [
        Answer(201, (("Content-Type", "application/json"), ("X-A", "é")), b'{"id": 1}', "replayed"),
        Answer(204, (), b"", "recorded"),
        Answer(
            599,
            (("Content-Length", "99"), ("Set-Cookie", "a"), ("set-cookie", "b")),
            b"x",
            "refused",
        ),
    ],
)
def test_an_answer_becomes_the_response_mitmproxy_s_own_constructor_would_build(answer):
    built = to_response(answer)
    checked = http.Response(  # the validating constructor to_response leaves out
        b"HTTP/1.1",
        built.status_code,
        built.data.reason,
        http.Headers(built.headers.fields),
        built.raw_content,
        None,
        built.timestamp_start,
        built.timestamp_end,
    )
    assert built.get_state() == checked.get_state()
    assert list(vars(built.data)) == list(vars(checked.data))
    assert vars(built.headers) == vars(checked.headers)
    assert (built.status_code, built.raw_content) == (answer.status, answer.body)
    assert built.headers.get_all("set-cookie") == [
        v for n, v in answer.headers if n.lower() == "set-cookie"
    ]
    if answer.status == 204:  # RFC 9110 §8.6: a server must not send one with a 204
        assert "content-length" not in built.headers
    else:
        assert built.headers["content-length"] == str(len(answer.body))
    assert built.stream is False


def test_a_not_modified_answer_states_no_length_of_its_own() -> None:
    """A 304's Content-Length would be the length of the representation it stands for:
    an answer built from a record (which kept no such header) states none."""
    built = to_response(Answer(304, (("ETag", '"a"'), ("Content-Length", "120")), b"", "replayed"))
    assert "content-length" not in built.headers
    assert built.headers["etag"] == '"a"'


@pytest.mark.parametrize(
    ("target", "headers", "why"),
    [
        ("/v1/charges", (("X-Name", "J\u00fcrgen"), ("X-Tab", "a\tb")), None),  # UTF-8, HTAB
        ("/caf\u00e9?q=\u00e9", (), None),
        ("/a\udcff/b", (), "the request target has bytes that are not UTF-8"),
        ("/x", (("X-Name", "J\udcfcrgen"),), "header X-Name has bytes that are not UTF-8"),
        ("/x", (("X-Trace", "a\x00b"),), "header X-Trace has a control character"),
        ("/x", (("Bad Name", "v"),), "header name 'Bad Name' is not an HTTP token"),
    ],
)
def test_a_request_the_upstream_client_would_send_otherwise_is_named_as_such(
    target: str, headers: tuple[tuple[str, str], ...], why: str | None
) -> None:
    # mitmproxy hands a byte that is not UTF-8 over as a lone surrogate; aiohttp's writer
    # leaves such a character out, so the request would leave other than it was recorded.
    found = unsendable_target(target) or unsendable_header(headers)
    assert (found is None) == (why is None)
    assert (found or "").startswith(why or "")


_TCHAR = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _field_by_field(headers: tuple[tuple[str, str], ...]) -> str | None:
    """The rules restated, field by field: a name is a token (RFC 9110 §5.1); a value
    holds no control character but HTAB (§5.5) and no byte that is not UTF-8."""
    for name, value in headers:
        if not name or not set(name) <= _TCHAR:
            return f"header name {name!r} is not an HTTP token"
        for char in value:
            if "\ud800" <= char <= "\udfff":
                return f"header {name} has bytes that are not UTF-8 in its value"
            if char != "\t" and (char < " " or char == "\x7f"):
                return f"header {name} has a control character in its value"
    return None


_HEADER_TEXT = st.text(alphabet="aZ-_ \t\n\r\x00\x7f\u00e9\udcff:", max_size=6)


@given(st.lists(st.tuples(_HEADER_TEXT, _HEADER_TEXT), max_size=5))
@example([("a\nb", "v")])  # a name that would pass as two if names were joined by LF
@example([("X-A", "1"), ("", "v")])
@example([("X-A", "a\tb"), ("X-B", "c\nd")])
@example([("X-A", "a"), ("X-B", "\udcff")])
def test_fields_are_looked_at_together_as_one_by_one(fields: list[tuple[str, str]]) -> None:
    # All names and all values are checked in one pass each; the first field that fails
    # is named as the field-by-field check names it.
    headers = tuple(fields)
    assert unsendable_header(headers) == _field_by_field(headers)


@pytest.mark.parametrize("raw", [b"caf\xc3\xa9", b"J\xfcrgen", b"plain; q=1"])
def test_a_header_value_leaves_with_the_bytes_the_upstream_client_received(raw: bytes) -> None:
    # The upstream client decodes header values as Latin-1: one character a byte.
    answer = Answer(201, (("X-Name", raw.decode("latin-1")),), b"{}", "recorded")
    assert to_response(answer).headers.fields[0] == (b"X-Name", raw)


def test_a_header_value_latin1_cannot_hold_leaves_as_utf8() -> None:
    # Typed by a human settling an effect, say.
    answer = Answer(201, (("X-Name", "Zoë €"),), b"{}", "recorded")
    assert to_response(answer).headers.fields[0] == (b"X-Name", "Zoë €".encode())
