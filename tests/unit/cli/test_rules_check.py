"""``sidecar rules check``: the shipped packs pass; a broken file is named at its line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.cli import main

PACKS = Path(__file__).resolve().parents[3] / "rules"


def test_the_shipped_rules_folder_passes(capsys):
    assert main(["rules", "check", str(PACKS)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert f"{PACKS / 'generic.yaml'}: 5 rules ok" in lines
    assert lines[-1].endswith("warnings)")  # "... files ok (N warnings)"
    # Only warnings on stderr: keyless non_idempotent rules (a body hash as their key).
    assert err
    assert all(": warning: rule " in line for line in err.splitlines())
    assert f"{PACKS / 'github.yaml'}:95: warning: rule github.issues.comments.create" in err


def test_a_broken_file_is_reported_as_file_line_on_stderr_with_exit_1(tmp_path, capsys):
    good = tmp_path / "good.yaml"
    good.write_text("rules:\n  - name: a\n    match: {host: x.com}\n    effect: read\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: b\n    match: {host: x.com, paht: /x}\n    effect: read\n")
    assert main(["rules", "check", str(good), str(bad)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert f"{bad}:3: rules[0].match: unknown field 'paht'" in err.splitlines()
    assert err.splitlines()[-1] == "rules check: 1 problem"


def test_one_rule_in_one_file_is_said_in_the_singular(tmp_path, capsys):
    path = tmp_path / "one.yaml"
    path.write_text("rules:\n  - name: a\n    match: {host: x.com}\n    effect: read\n")
    assert main(["rules", "check", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"{path}: 1 rule ok", "1 rule in 1 file ok"]


def test_a_missing_path_fails_the_check(tmp_path, capsys):
    assert main(["rules", "check", str(tmp_path / "nope")]) == 1
    assert "no such file or folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["rules", "--help"], ["rules", "check", "--help"]])
def test_rules_and_check_have_help(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 0
    assert "usage: sidecar rules" in capsys.readouterr().out


def test_check_needs_at_least_one_path(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["rules", "check"])
    assert exit_.value.code == 2
    assert "PATH" in capsys.readouterr().err


def test_every_problem_and_the_cross_rule_checks_come_in_one_run(tmp_path, capsys):
    """Field errors of every file, a cross-field check of a rule whose fields also failed,
    and a duplicate name of an invalid rule: one run, not one phase at a time."""
    first = tmp_path / "a.yaml"
    first.write_text(
        "rules:\n"
        "  - name: dup\n"
        "    match: {host: x.com, method: POST, path: /a}\n"
        "    effect: non_idempotent\n"
        "    key: a\n"
        "  - name: both\n"
        "    match: {host: x.com, method: POST, path: /b}\n"
        "    effect: non_idempotent\n"
        "    key: b\n"
        "    timeout_s: -1\n"
        "    on_unknown: probe\n"
    )
    second = tmp_path / "b.yaml"
    second.write_text(
        "rules:\n"
        "  - name: dup\n"
        "    match: {host: x.com, method: POST, path: /c}\n"
        "    effect: non_idempotent\n"
        "    key: c\n"
        "    max_body_bytes: 0\n"
        "  - name: keyless\n"
        "    match: {host: y.com, method: POST, path: /d}\n"
        "    effect: non_idempotent\n"
    )
    assert main(["rules", "check", str(first), str(second)]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""
    assert any(line.startswith(f"{first}:10: rules[1].timeout_s: ") for line in lines), lines
    assert (
        f"{first}:11: rules[1].on_unknown: 'on_unknown: probe' needs a 'probe' section "
        "saying what to ask" in lines
    )
    assert any(line.startswith(f"{second}:6: rules[0].max_body_bytes: ") for line in lines)
    assert f"{second}:2: duplicate rule name 'dup' (first defined at {first}:2)" in lines
    assert any(
        line.startswith(f"{second}:7: warning: rule keyless is non_idempotent") for line in lines
    )
    assert lines[-1] == "rules check: 4 problems, 1 warning"


SHADOWED = """\
rules:
  - name: everything.on.x
    match: {host: x.com, method: [POST, PUT]}
    effect: non_idempotent
    key: "{path}"
  - name: x.things
    match: {host: x.com, method: POST, path: /things}
    effect: non_idempotent
    key: "{body.name}"
  - name: y.first
    match: {host: y.com, method: POST, path: "/r/{owner}/things"}
    effect: idempotent
  - name: y.again
    match: {host: y.com, method: POST, path: "/r/{name}/things/"}
    effect: non_idempotent
    key: "{body.name}"
  - name: y.other
    match: {host: y.com, method: POST, path: "/r/{owner}/stuff"}
    effect: non_idempotent
    key: "{body.name}"
"""


def test_shadowed_rules_are_warned_of_at_their_line_and_do_not_fail_the_check(tmp_path, capsys):
    path = tmp_path / "shadow.yaml"
    path.write_text(SHADOWED)
    assert main(["rules", "check", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{path}:6: warning: rule x.things can never match: rule everything.on.x ({path}:2) "
        "comes first and matches every request it would",
        f"{path}:13: warning: rule y.again can never match: rule y.first ({path}:10) "
        "comes first and matches every request it would",
    ]
    assert out.splitlines()[-1] == "5 rules in 1 file ok (2 warnings)"


def test_json_says_every_problem_and_warning_with_its_line(tmp_path, capsys):
    rules = tmp_path / "r.yaml"
    rules.write_text(
        "rules:\n"
        "  - name: a\n"
        "    match: {host: x.test, method: POST, path: /a}\n"
        "    effect: non_idempotent\n"
        "  - name: b\n"
        "    match: {host: x.test, method: POST, path: /b}\n"
        "    effect: bogus\n"
    )
    assert main(["rules", "check", "--json", str(rules)]) == 1

    found = json.loads(capsys.readouterr().out)
    assert found["ok"] is False
    assert [(p["line"], "effect" in p["message"]) for p in found["problems"]] == [(7, True)]
    assert [w["line"] for w in found["warnings"]] == [2]
