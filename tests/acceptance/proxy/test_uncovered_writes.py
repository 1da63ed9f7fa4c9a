"""Writes no rule covers, with a real ``sidecar serve`` and a real upstream (issue 14).

Default: streamed through, logged once per (host, method, path shape), counted by host
on /metrics; ``--uncovered-writes deny``: 403 problem+json and the upstream never sees
it; ``record``: listed in the task's effect log.  Connections to hosts no rule or route
names are relayed as raw bytes and counted by host.
"""

from __future__ import annotations

import socket
import urllib.request
from urllib.parse import urlsplit

from tests.acceptance.proxy.conftest import run_agent
from tests.support.stack import Stack

UNCOVERED = "https://api.things.test/effects/{}"


def post(number: int) -> dict[str, object]:
    return {"method": "POST", "url": UNCOVERED.format(number), "json": {"note": number}}


def metrics(stack: Stack) -> str:
    with urllib.request.urlopen(f"{stack.control_url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def test_by_default_an_uncovered_write_passes_is_logged_once_by_shape_and_counted(stack):
    answers = run_agent(stack, "u1", "requests", [post(101), post(202)])
    assert [a["status"] for a in answers] == [201, 201]
    assert {a["x-sidecar-effect"] for a in answers} == {"passthrough"}
    assert stack.counts()["requests"]["POST /effects/101"] == 1
    logged = [line for line in stack.log_lines() if line["msg"].startswith("uncovered write")]
    assert len(logged) == 1, logged  # two requests, one shape
    assert (logged[0]["host"], logged[0]["method"], logged[0]["shape"]) == (
        "api.things.test",
        "POST",
        "/effects/{id}",
    )
    assert logged[0]["level"] == "warning"
    text = metrics(stack)
    assert 'sidecar_uncovered_writes_total{host="api.things.test",method="POST"} 2.0' in text
    assert stack.effects("u1") == []  # log mode records nothing


def test_deny_refuses_with_problem_json_and_the_upstream_never_sees_it(make_stack):
    stack = make_stack(sidecar_args=["--uncovered-writes", "deny"])
    (answer,) = run_agent(stack, "u2", "requests", [post(7)])
    assert answer["status"] == 403
    assert answer["x-sidecar-effect"] == "refused"
    problem = answer["body"]
    assert problem["code"] == "uncovered_write"
    assert (problem["host"], problem["method"], problem["path"]) == (
        "api.things.test",
        "POST",
        "/effects/7",
    )
    assert problem["rule_file"].endswith("things.yaml")
    assert "POST /effects/7" not in stack.counts()["requests"]
    # A covered write still goes through.
    thing = {
        "method": "POST",
        "url": "https://api.things.test/repos/a/b/things",
        "json": {"name": "n"},
    }
    (created,) = run_agent(stack, "u2b", "requests", [thing])
    assert created["status"] == 201


def test_record_lists_it_in_the_tasks_effects_and_never_replays_it(make_stack):
    stack = make_stack(sidecar_args=["--uncovered-writes", "record"])
    first = run_agent(stack, "u3", "requests", [post(5)])
    again = run_agent(stack, "u3", "requests", [post(5)])  # a second attempt: sent again
    assert [a["status"] for a in first + again] == [201, 201]
    assert {a["x-sidecar-effect"] for a in first + again} == {"passthrough"}
    assert stack.counts()["requests"]["POST /effects/5"] == 2
    effects = stack.effects("u3")
    assert len(effects) == 2
    for effect in effects:
        assert (effect["rule"], effect["kind"], effect["state"]) == (
            "uncovered",
            "uncovered",
            "completed",
        )
        assert effect["key"].startswith("uncovered:POST api.things.test/effects/{id}#")
        assert effect["request"]["url"] == "https://api.things.test/effects/5"
        assert effect["request"]["shape"] == "/effects/{id}"


def test_connections_to_hosts_no_rule_names_are_counted_as_tunnelled(stack):
    upstream = urlsplit(stack.upstream_url)
    proxy = urlsplit(stack.proxy_url)
    target = f"localhost:{upstream.port}"  # no rule or route names it: relayed as bytes
    with socket.create_connection((proxy.hostname, proxy.port), timeout=10) as raw:
        raw.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert raw.recv(1024).startswith(b"HTTP/1.1 200")
        raw.sendall(
            b"GET /_upstream/counts HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
        )
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200")
    assert b"X-Sidecar-Effect" not in answer  # never seen as HTTP by the sidecar
    assert 'sidecar_tunnelled_connections_total{host="localhost"} 1.0' in metrics(stack)
