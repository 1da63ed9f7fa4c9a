"""The effect flow of SPEC §3, end to end: real sidecar, real clients, counting upstream."""

from __future__ import annotations

import os
import signal
import sqlite3
from contextlib import closing

import pytest
import requests

from tests.acceptance.proxy.conftest import (
    charge,
    results,
    run_agent,
    settled_effects,
    start_agent,
    thing,
)

pytestmark = pytest.mark.acceptance


def test_a_killed_agents_recorded_charge_is_replayed_not_repeated(stack):
    first = start_agent(stack, "312", "requests", [charge("order-7"), {"sleep": 60}])
    first.wait_for(r'"status": 201')
    pid = int(first.wait_for(r"^pid (\d+)").group(1))
    os.kill(pid, signal.SIGKILL)  # the agent, not the sidecar: exec releases the lease
    assert first.proc.wait(timeout=30) == 128 + 9
    (recorded,) = results(first)
    assert recorded["x-sidecar-effect"] == "recorded"

    (again,) = run_agent(stack, "312", "requests", [charge("order-7")])
    assert again["x-sidecar-effect"] == "replayed"
    assert again["idempotent-replayed"] == "true"
    assert again["body"] == recorded["body"]
    assert stack.counts()["requests"] == {"POST /v1/charges": 1}
    (effect,) = settled_effects(stack, "312", events=3)
    assert [e["event"] for e in effect["events"]] == ["pending", "completed", "replayed"]
    assert effect["events"][2]["attempt_id"] != effect["origin_attempt_id"]


@pytest.mark.parametrize("client", ["requests", "httpx", "aiohttp", "curl"])
def test_each_client_library_goes_through_the_proxy_and_trusts_its_ca(stack, client):
    first = run_agent(stack, "312", client, [charge(f"{client}-1")])
    second = run_agent(stack, "312", client, [charge(f"{client}-1")])
    assert [r["x-sidecar-effect"] for r in first + second] == ["recorded", "replayed"]
    assert first[0]["body"] == second[0]["body"]
    assert stack.counts()["charges"] == 1


def test_the_idempotency_key_is_minted_once_and_overrides_the_clients(stack):
    (first,) = run_agent(
        stack, "312", "requests", [charge("order-9", **{"Idempotency-Key": "sdk-random-1"})]
    )
    minted = first["body"]["idempotency_key"]
    assert minted.startswith("att-")
    assert minted != "sdk-random-1"


def test_concurrent_identical_requests_reach_the_upstream_once(stack):
    slow = thing("gadget", path="/slow/things?delay=0.5")
    answers = run_agent(stack, "312", "requests", [{"parallel": [slow, slow, slow]}])
    assert sorted(a["x-sidecar-effect"] for a in answers) == ["recorded", "replayed", "replayed"]
    assert len({str(a["body"]) for a in answers}) == 1
    assert stack.counts()["requests"] == {"POST /slow/things": 1}


def test_a_divergent_payload_is_replayed_and_flagged(stack):
    run_agent(stack, "312", "requests", [thing("widget", colour="red")])
    (again,) = run_agent(stack, "312", "requests", [thing("widget", colour="blue")])
    assert again["x-sidecar-effect"] == "replayed"
    assert again["x-sidecar-divergent"] == "true"
    assert again["body"]["name"] == "widget"
    assert stack.counts()["things"] == 1
    (effect,) = settled_effects(stack, "312", events=3)
    assert effect["events"][-1]["detail"] == "payload differs from the recorded one"


def test_a_divergent_payload_is_rejected_when_the_rule_says_so(stack):
    run_agent(stack, "312", "requests", [thing("widget", host="strict.things.test", colour="red")])
    (again,) = run_agent(
        stack, "312", "requests", [thing("widget", host="strict.things.test", colour="blue")]
    )
    assert again["status"] == 422
    assert again["body"]["code"] == "payload_mismatch"
    assert stack.counts()["things"] == 1


def test_an_upstream_timeout_is_unknown_and_the_late_answer_is_kept_for_the_retry(stack):
    """The agent gives up at the rule's 1 s and exits; its release waits for the first
    try's connection, whose 201 comes at 3 s and is recorded (SPEC §3.7, §3.8): the next
    attempt is answered from the log, with no probe and nothing sent again."""
    late = thing("sprocket", path="/slow/things?delay=3")
    (timed_out,) = run_agent(stack, "312", "requests", [late])
    assert timed_out["status"] == 504
    assert timed_out["body"]["code"] == "upstream_failed"
    (again,) = run_agent(stack, "312", "requests", [late])
    assert again["x-sidecar-effect"] == "replayed"
    assert again["status"] == 201
    assert again["body"]["name"] == "sprocket"
    assert stack.counts()["requests"] == {"POST /slow/things": 1}


def test_a_5xx_leaves_the_effect_unknown_and_the_retry_finds_it_by_probe(stack):
    broken = thing("cog", path="/broken/things")
    (failed,) = run_agent(stack, "312", "requests", [broken])
    assert failed["status"] == 500
    assert failed["x-sidecar-effect-state"] == "unknown"
    (again,) = run_agent(stack, "312", "requests", [broken])
    assert again["x-sidecar-effect"] == "probed"
    assert stack.counts()["things"] == 1


def test_an_unknown_outcome_with_no_probe_is_blocked_for_a_human(stack):
    broken = thing("cog", host="blocked.things.test", path="/broken/things")
    run_agent(stack, "312", "requests", [broken])
    (again,) = run_agent(stack, "312", "requests", [broken])
    assert again["status"] == 409
    assert again["body"]["code"] == "effect_unknown"
    assert "CANNOT DETERMINE" in again["body"]["detail"]
    assert stack.counts()["requests"] == {"POST /broken/things": 1}


def test_a_streamed_model_answer_is_cached_and_replayed_byte_for_byte(stack):
    ask = {
        "stream": "https://api.openai.com/v1/chat/completions",
        "json": {"model": "m", "stream": True, "messages": [{"role": "user", "content": "patch"}]},
    }
    (first,) = run_agent(stack, "312", "httpx", [ask])
    (second,) = run_agent(stack, "312", "httpx", [ask])
    assert first["x-sidecar-effect"] == "recorded"
    assert second["x-sidecar-effect"] == "replayed"
    assert first["sha256"] == second["sha256"]
    assert first["bytes"] > 100
    assert stack.counts()["requests"] == {"POST /v1/chat/completions": 1}


def test_reads_pass_through_untouched(stack):
    lookup = {"method": "GET", "url": "https://api.things.test/repos/acme/app/things?name=x"}
    answers = run_agent(stack, "312", "requests", [lookup, lookup])
    assert [a["x-sidecar-effect"] for a in answers] == ["passthrough", "passthrough"]
    assert stack.counts()["requests"] == {"GET /repos/acme/app/things": 2}


def test_a_request_with_no_task_bound_is_refused_and_not_forwarded(stack):
    proxies = {"https": stack.proxy_url, "http": stack.proxy_url}
    refused = requests.post(
        "https://api.things.test/repos/acme/app/things",
        json={"name": "x"},
        proxies=proxies,
        verify=stack.ca_cert,
        timeout=30,
    )
    assert refused.status_code == 428
    assert refused.json()["code"] == "task_unbound"
    assert stack.counts()["requests"] == {}


def test_the_task_header_binds_a_request_and_is_not_forwarded(stack):
    proxies = {"https": stack.proxy_url}
    claim = requests.post(
        f"{stack.control_url}/v1/tasks/77/claim", json={"worker": "w", "ttl_s": 30}, timeout=10
    )
    assert claim.status_code == 200
    answer = requests.post(
        "https://api.things.test/repos/acme/app/things",
        json={"name": "by-header"},
        headers={"X-Sidecar-Task": "77"},
        proxies=proxies,
        verify=stack.ca_cert,
        timeout=30,
    )
    assert answer.headers["X-Sidecar-Effect"] == "recorded"
    assert [e["key"] for e in stack.effects("77")] == ["acme/app#thing:by-header"]
    (seen,) = stack.things()
    assert "x-sidecar-task" not in seen["headers"]
    assert "proxy-authorization" not in seen["headers"]


def test_secrets_never_reach_the_effect_log(stack):
    run_agent(stack, "312", "requests", [charge("order-secret")])
    (effect,) = stack.effects("312")
    assert effect["request"]["headers"]["authorization"] == "[redacted]"
    for name in ("effects.db", "effects.db-wal"):
        path = stack.data_dir / name
        if path.exists():
            assert b"sk_live_4eC39HqLyjWDarjtT1zdp7dc" not in path.read_bytes(), name
    with closing(sqlite3.connect(stack.data_dir / "effects.db")) as db:
        (request,) = db.execute("SELECT request FROM effects").fetchone()
    assert "sk_live" not in request


def test_a_header_the_upstream_client_cannot_send_is_refused_before_anything_is_recorded(stack):
    # mitmproxy takes a NUL in a header value; the sidecar's own HTTP client refuses it.
    # Once, that exception left the addon and mitmproxy forwarded the charge on its own:
    # unrecorded, without the Idempotency-Key, so the next attempt charged again.
    (refused,) = run_agent(stack, "312", "requests", [charge("order-nul", **{"X-Trace": "a\0b"})])
    assert refused["status"] == 400
    assert refused["x-sidecar-effect"] == "refused"
    assert refused["body"]["code"] == "invalid_request"
    assert "control character" in refused["body"]["detail"]
    assert stack.counts()["requests"] == {}
    assert stack.effects("312") == []

    (again,) = run_agent(stack, "312", "requests", [charge("order-nul")])
    assert again["x-sidecar-effect"] == "recorded"
    assert stack.counts()["charges"] == 1


def test_a_header_value_that_is_not_utf8_is_refused_rather_than_sent_without_its_bytes(stack):
    # requests writes a header value as Latin-1: "J\xfcrgen" is not UTF-8. The sidecar's
    # HTTP client would send "Jrgen" - another request than the one recorded.
    step = charge("order-latin1", **{"X-Customer": "J\u00fcrgen"})
    (refused,) = run_agent(stack, "312", "requests", [step])
    assert (refused["status"], refused["x-sidecar-effect"]) == (400, "refused")
    assert refused["body"]["code"] == "invalid_request"
    assert "X-Customer has bytes that are not UTF-8" in refused["body"]["detail"]
    assert stack.counts()["requests"] == {}
    assert stack.effects("312") == []


def test_a_late_answer_is_kept_and_the_retry_is_not_sent_again(stack):
    """SPEC §3.8: the upstream creates the thing 3 s after the request, the rule gives up
    after 1 s. The agent retries at once; a probe then would find nothing and send it
    again. Instead the first try's connection is kept, its 201 recorded and replayed."""
    late = thing("slowpoke", path="/late/things?delay=3")
    gave_up, again = run_agent(stack, "312", "requests", [late, late])
    assert (gave_up["status"], gave_up["body"]["code"]) == (504, "upstream_failed")
    assert (again["status"], again["x-sidecar-effect"]) == (201, "replayed")
    assert again["body"]["name"] == "slowpoke"
    assert stack.counts()["requests"].get("POST /late/things") == 1
    assert stack.counts()["things"] == 1
    (effect,) = stack.effects("312")
    assert effect["state"] == "completed"
