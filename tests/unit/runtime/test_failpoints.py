"""Failpoint entries: which visit of which point fires, and what it does."""

from __future__ import annotations

import pytest

from sidecar.runtime import failpoints


def test_an_entry_names_its_point_rule_ordinal_and_action() -> None:
    armed = failpoints.parse("effect.after_record:github.pulls.create#3=stop")
    assert (armed.point, armed.rule, armed.nth, armed.action) == (
        "effect.after_record",
        "github.pulls.create",
        3,
        "stop",
    )
    assert failpoints.parse("sql.after_commit").action == "kill"
    assert failpoints.parse("effect.upstream_answer#2=delay:3.5").delay_s == 3.5


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("effect.nowhere", "unknown failpoint"),
        ("effect.after_record#0", "counts from 1"),
        ("effect.after_record#x", "counts from 1"),
        ("effect.after_record=explode", "kill, stop or delay"),
        ("effect.after_record=delay", "kill, stop or delay"),
    ],
)
def test_a_bad_entry_says_what_is_wrong(entry: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        failpoints.parse(entry)


def test_the_nth_visit_fires_once() -> None:
    armed = failpoints.parse("effect.after_pending#2")
    visits = [armed.fires("effect.after_pending", "any") for _ in range(4)]
    assert visits == [False, True, False, False]


def test_a_rule_entry_counts_only_that_rules_visits() -> None:
    armed = failpoints.parse("effect.after_pending:b#2")
    visits = [armed.fires("effect.after_pending", rule) for rule in ("a", "b", "a", "b")]
    assert visits == [False, False, False, True]
    assert not armed.fires("effect.after_record", "b")


async def test_a_delay_holds_the_caller_without_killing_it() -> None:
    failpoints.arm("effect.upstream_answer=delay:0.01")
    try:
        failpoints.reach("effect.upstream_answer")  # a delay entry never kills
        await failpoints.late("effect.upstream_answer")
        assert failpoints._ARMED[0].fired
    finally:
        failpoints.arm("")
