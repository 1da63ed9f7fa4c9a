"""Uncovered writes: bounded host labels, the deny answer, "log once per shape", and no
coroutine made for a flow that is not an uncovered write."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from pathlib import Path

import pytest
from mitmproxy.test import tflow

from sidecar.config import load
from sidecar.errors import ConfigError
from sidecar.proxy.addons.effects import UNMATCHED
from sidecar.proxy.addons.uncovered import UncoveredMode, UncoveredWrites
from sidecar.rules import load_rules
from sidecar.runtime.metrics import OTHER, BoundedLabels, Metrics

RULES = """\
rules:
  - name: things.create
    match: {host: api.things.test, method: POST, path: /things}
    effect: non_idempotent
    key: "{body.name}"
"""


def test_host_labels_are_capped_then_other():
    labels = BoundedLabels(cap=3)
    assert [labels(h) for h in ("a", "b", "a", "c")] == ["a", "b", "a", "c"]
    assert labels("d") == OTHER
    assert labels("b") == "b"  # a host seen before keeps its label


def addon(tmp_path: Path, mode: UncoveredMode) -> tuple[UncoveredWrites, Metrics, Path]:
    path = tmp_path / "things.yaml"
    path.write_text(RULES)
    metrics = Metrics()
    # No recorder is needed for log and deny.
    return UncoveredWrites(mode, load_rules([path]), metrics, None), metrics, path  # type: ignore[arg-type]


async def run(outcome: Awaitable[None] | None) -> None:
    """What a hook returned, awaited as mitmproxy awaits it (None: nothing to do)."""
    if outcome is not None:
        await outcome


def unmatched(method: str, path: str, host: str = "api.things.test"):
    flow = tflow.tflow()
    flow.request.method = method
    flow.request.host = host
    flow.request.port = 443
    flow.request.scheme = "https"
    flow.request.path = path
    flow.metadata[UNMATCHED] = True
    return flow


def count(metrics: Metrics, host: str, method: str) -> float:
    value = metrics.registry.get_sample_value(
        "sidecar_uncovered_writes_total", {"host": host, "method": method}
    )
    return value or 0.0


async def test_logged_once_per_host_method_and_shape_and_counted_each_time(tmp_path, caplog):
    uncovered, metrics, _ = addon(tmp_path, UncoveredMode.LOG)
    caplog.set_level(logging.WARNING, "sidecar.proxy")
    for path in ("/issues/1/comments", "/issues/22/comments?x=1", "/issues/3/labels"):
        flow = unmatched("POST", path)
        await run(uncovered.requestheaders(flow))
        assert flow.response is None  # passed through
    # A read, and a write a rule matched: nothing to do, not even a coroutine made.
    assert uncovered.requestheaders(unmatched("GET", "/issues/4/comments")) is None
    matched = unmatched("POST", "/things")
    del matched.metadata[UNMATCHED]
    assert uncovered.requestheaders(matched) is None
    assert uncovered.responseheaders(matched) is None
    assert uncovered.error(matched) is None
    lines = [r for r in caplog.records if "uncovered write" in r.getMessage()]
    assert [r.shape for r in lines] == ["/issues/{id}/comments", "/issues/{id}/labels"]  # type: ignore[attr-defined]
    assert lines[0].getMessage().startswith("uncovered write: POST api.things.test/issues/")
    assert count(metrics, "api.things.test", "POST") == 3
    assert count(metrics, "api.things.test", "GET") == 0


async def test_deny_answers_403_problem_json_naming_the_request_and_the_rule_file(tmp_path):
    uncovered, metrics, path = addon(tmp_path, UncoveredMode.DENY)
    flow = unmatched("DELETE", "/things/123?force=1")
    await run(uncovered.requestheaders(flow))
    assert flow.response is not None
    assert flow.response.status_code == 403
    assert flow.request.stream is False  # answered before the body: nothing is streamed
    assert flow.response.headers["content-type"] == "application/problem+json"
    body = json.loads(flow.response.content or b"")
    assert body["code"] == "uncovered_write"
    assert (body["host"], body["method"], body["path"]) == (
        "api.things.test",
        "DELETE",
        "/things/123",
    )
    assert body["rule_file"] == str(path)
    assert str(path) in body["detail"]
    assert body["suggested_match"]["path"] == "/things/{id}"
    assert count(metrics, "api.things.test", "DELETE") == 1


async def test_deny_on_a_host_no_rule_names_says_to_give_a_rule_file(tmp_path):
    uncovered, _, _ = addon(tmp_path, UncoveredMode.DENY)
    flow = unmatched("PUT", "/x", host="other.test")
    await run(uncovered.requestheaders(flow))
    body = json.loads(flow.response.content or b"")  # type: ignore[union-attr]
    assert body["rule_file"] is None
    assert "a rule file given with --rules" in body["detail"]


def test_the_setting_takes_log_record_or_deny(monkeypatch):
    assert load({}).uncovered_writes == "log"
    assert load({"uncovered_writes": "deny"}).uncovered_writes == "deny"
    monkeypatch.setenv("SIDECAR_UNCOVERED_WRITES", "record")
    assert load({}).uncovered_writes == "record"
    with pytest.raises(ConfigError, match="uncovered_writes"):
        load({"uncovered_writes": "block"})
