"""``sidecar rules check``: the shipped packs pass; a broken file is named at its line."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli import main

PACKS = Path(__file__).resolve().parents[3] / "rules"


def test_the_shipped_rules_folder_passes(capsys):
    assert main(["rules", "check", str(PACKS)]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert f"{PACKS / 'generic.yaml'}: 5 rules ok" in lines
    assert lines[-1].endswith("files ok")
    assert err == ""


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
