"""The cells of a matrix: every effect x every fault, each armed at the right visit."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.matrix.faults import BY_NAME, FAULTS, chosen
from sidecar.matrix.plan import cells, effect_points
from sidecar.rules import RuleSet, load_rules

RULES = """
version: 1
rules:
  - name: shop.charge
    match: {host: api.shop.test, method: POST, path: /v1/charges}
    effect: non_idempotent
    key: "charge"
    timeout_s: 3
  - name: model
    match: {host: api.openai.com, method: POST, path: /v1/chat/completions}
    effect: cache
  - name: ledger
    match: {sql: {kind: INSERT}}
    effect: non_idempotent
"""


def effect(key: str, rule: str, kind: str = "http") -> dict[str, str]:
    return {"key": key, "rule": rule, "kind": kind, "state": "completed"}


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return load_rules([path])


def test_effects_are_numbered_overall_and_within_their_kind() -> None:
    points = effect_points(
        [
            effect("m", "model"),
            effect("s1", "ledger", "sql"),
            effect("u", "none", "uncovered"),
            effect("c", "shop.charge", "git"),
            effect("s2", "ledger", "sql"),
        ]
    )
    assert [(p.index, p.key, p.nth) for p in points] == [
        (1, "m", 1),
        (2, "s1", 1),
        (3, "c", 2),
        (4, "s2", 2),
    ]


def test_each_effect_meets_each_fault_at_its_own_visit(rules: RuleSet) -> None:
    points = effect_points([effect("m", "model"), effect("c", "shop.charge")])
    todo = cells(points, FAULTS, rules, "abc")
    assert len(todo) == 2 * len(FAULTS)
    armed = {(c.effect.key, c.fault.name): c.failpoints for c in todo}
    assert armed["c", "sidecar-killed-after-forward"] == "effect.after_upstream#2=kill"
    assert armed["c", "agent-killed-after-record"] == "effect.after_record#2=stop"
    # the upstream's answer is held one second past the rule's timeout
    assert armed["c", "upstream-timeout"] == "effect.upstream_answer#2=delay:4"
    # a stale worker is frozen once the previous effect is answered, before it sends this
    assert armed["c", "stale-worker"] == "effect.after_record#1=stop"
    assert armed["m", "stale-worker"] == "effect.before_pending#1=stop"
    assert {c.task for c in todo} == {f"mabc-e{c.effect.index}-{c.fault.name}" for c in todo}


def test_a_cell_that_cannot_be_run_says_why(rules: RuleSet) -> None:
    points = effect_points([effect("m", "model"), effect("s", "ledger", "sql")])
    todo = {(c.effect.key, c.fault.name): c for c in cells(points, FAULTS, rules, "abc")}
    assert "cached model call" in todo["m", "upstream-timeout"].cannot_run
    assert "does not apply to SQL statements" in todo["s", "upstream-timeout"].cannot_run
    assert todo["s", "sidecar-killed-after-record"].failpoints == "sql.after_commit#1=kill"
    assert todo["s", "stale-worker"].failpoints == "effect.after_record#1=stop"


def test_faults_are_chosen_by_name() -> None:
    assert chosen(None) == FAULTS
    assert chosen("stale-worker, upstream-timeout") == (
        BY_NAME["stale-worker"],
        BY_NAME["upstream-timeout"],
    )
    with pytest.raises(ValueError, match=r"unknown fault.*nope"):
        chosen("stale-worker,nope")


def test_against_a_running_sidecar_only_the_faults_done_to_the_worker_are_watched_for(
    rules: RuleSet,
) -> None:
    points = effect_points([effect("m", "model"), effect("c", "shop.charge")])
    todo = {
        (c.effect.key, c.fault.name): c for c in cells(points, FAULTS, rules, "abc", running=True)
    }
    assert todo["c", "agent-killed-after-forward"].watch == (2, "pending")
    assert todo["c", "agent-killed-after-record"].watch == (2, "completed")
    assert todo["c", "stale-worker"].watch == (1, "completed")  # frozen before it sends #2
    assert todo["m", "stale-worker"].watch == (1, "pending")
    for fault in ("sidecar-killed-after-record", "upstream-timeout", "store-unavailable"):
        assert "needs a private sidecar" in todo["c", fault].cannot_run
    assert all(not c.failpoints for c in todo.values())
