"""Loading rule files: every problem in every file at once, each at its FILE:LINE."""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

import pytest

from sidecar.errors import ConfigError
from sidecar.rules import RuleError, RuleProblem, RuleSource, load_rules

GOOD = """\
rules:
  - name: payments.charge
    match: {host: api.example-payments.com, method: POST, path: /v1/charges}
    effect: non_idempotent
    key: "{header.X-Order-Id}"
    idempotency_header: Idempotency-Key
    on_unknown: retry
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(dedent(text))
    return path


def problems(*paths: Path) -> list[str]:
    """Each problem as ``NAME:LINE: message`` (file name only, for readable asserts)."""
    with pytest.raises(RuleError) as error:
        load_rules(paths)
    return [f"{p.file.name}:{p.line}: {p.message}" for p in error.value.problems]


def only_problem(tmp_path: Path, text: str) -> str:
    found = problems(write(tmp_path, "rules.yaml", text))
    assert len(found) == 1, found
    return found[0]


def test_a_valid_file_loads_with_where_each_rule_came_from(tmp_path):
    path = write(tmp_path, "pay.yaml", GOOD)
    rules = load_rules([path])
    assert [rule.name for rule in rules] == ["payments.charge"]
    assert rules.sources["payments.charge"] == RuleSource(path, 2)
    assert rules.files == (path,)


def test_malformed_yaml_is_reported_at_the_parsers_line(tmp_path):
    text = "rules:\n  - name: x\n    match: {host: a\n    effect: read\n"
    assert only_problem(tmp_path, text).startswith("rules.yaml:4: invalid YAML: ")


def test_tabs_and_bad_indentation_are_yaml_errors_too(tmp_path):
    text = "rules:\n  - name: x\n   effect: read\n"
    assert only_problem(tmp_path, text).startswith("rules.yaml:3: invalid YAML")


def test_an_unknown_field_points_at_its_key(tmp_path):
    text = """\
    rules:
      - name: a
        match:
          host: api.x.com
          paht: /v1/x
        effect: read
    """
    assert only_problem(tmp_path, text) == "rules.yaml:5: rules[0].match: unknown field 'paht'"


def test_a_wrong_type_points_at_the_value(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: read
        timeout_s:
          - 30
    """
    problem = only_problem(tmp_path, text)
    assert problem.startswith("rules.yaml:5: rules[0].timeout_s: input should be a valid number")


def test_a_wrong_enum_value_lists_the_allowed_ones(tmp_path):
    text = "rules:\n  - name: a\n    match: {host: x}\n    effect: write\n"
    assert only_problem(tmp_path, text) == (
        "rules.yaml:4: rules[0].effect: input should be 'read', 'idempotent', "
        "'non_idempotent' or 'cache', got 'write'"
    )


def test_a_statement_kind_postgresql_has_not_is_refused_with_the_nearest_one(tmp_path):
    # A misspelt kind would never match: the statements it meant would run unrecorded.
    text = "rules:\n  - name: a\n    match: {sql: {kind: [CREATE, COPPY]}}\n    effect: read\n"
    assert only_problem(tmp_path, text) == (
        "rules.yaml:3: rules[0].match.sql.kind: COPPY is not the first word of any "
        "PostgreSQL statement, so the rule could never match; did you mean COPY?"
    )


def test_a_missing_field_points_at_the_mapping_that_lacks_it(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: read
      - name: b
        match: {host: api.x.com}
    """
    assert only_problem(tmp_path, text) == "rules.yaml:5: rules[1]: missing field 'effect'"


def test_bad_jmespath_points_at_the_expression(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com, path: "/r/{id}"}
        effect: non_idempotent
        on_unknown: probe
        probe:
          request: {path: "/r/{id}"}
          found: "length(@"
          answer: {status: 201}
    """
    assert only_problem(tmp_path, text) == (
        "rules.yaml:8: rules[0].probe.found: invalid JMESPath 'length(@': incomplete expression"
    )


def test_bad_jmespath_inside_a_key_template_points_at_the_key(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: non_idempotent
        key: "{body.items[}"
    """
    assert only_problem(tmp_path, text).startswith(
        "rules.yaml:5: rules[0].key: invalid JMESPath 'items['"
    )


def test_a_bad_path_template_points_at_the_path(tmp_path):
    text = """\
    rules:
      - name: a
        match:
          host: api.x.com
          path: /v1/{id}{ext}
        effect: read
    """
    assert only_problem(tmp_path, text) == (
        "rules.yaml:5: rules[0].match.path: invalid path template '/v1/{id}{ext}': "
        "'{id}{ext}': at most one {name} per segment, braces balanced"
    )


def test_a_duplicate_key_is_refused_at_the_duplicate(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: read
        effect: non_idempotent
    """
    assert only_problem(tmp_path, text) == "rules.yaml:5: rules[0]: duplicate key 'effect'"


def test_a_duplicate_rule_name_across_files_names_the_first_definition(tmp_path):
    first = write(tmp_path, "a.yaml", GOOD)
    second = write(tmp_path, "b.yaml", "\n\n" + GOOD)
    assert problems(first, second) == [
        f"b.yaml:4: duplicate rule name 'payments.charge' (first defined at {first}:2)"
    ]


def test_on_unknown_probe_without_a_probe_points_at_on_unknown(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: non_idempotent
        on_unknown: probe
    """
    problem = only_problem(tmp_path, text)
    assert problem.startswith("rules.yaml:5: rules[0].on_unknown: 'on_unknown: probe' needs")


def test_a_read_rule_with_a_probe_points_at_the_probe(tmp_path):
    text = """\
    rules:
      - name: a
        match: {host: api.x.com}
        effect: read
        on_unknown: probe
        probe:
          request: {path: /x}
          found: "@"
          answer: {status: 200}
    """
    assert only_problem(tmp_path, text) == (
        "rules.yaml:6: rules[0].probe: 'probe' is only meaningful for non_idempotent and "
        "cache rules; this rule's effect is read"
    )


def test_problems_of_every_file_are_reported_together_in_line_order(tmp_path):
    write(tmp_path, "a.yaml", "rules:\n  - name: a\n    effect: read\n    colour: blue\n")
    write(tmp_path, "b.yaml", "rules: [\n")
    write(tmp_path, "c.yaml", GOOD)
    found = problems(tmp_path)
    assert found[0] == "a.yaml:2: rules[0]: missing field 'match'"
    assert found[1] == "a.yaml:4: rules[0]: unknown field 'colour'"
    assert found[2].startswith("b.yaml:2: invalid YAML")
    assert len(found) == 3


def test_the_error_is_a_config_error_printed_one_problem_a_line(tmp_path):
    path = write(tmp_path, "a.yaml", "rules:\n  - name: a\n    effect: read\n    colour: 1\n")
    with pytest.raises(ConfigError) as error:
        load_rules([path])
    assert isinstance(error.value, RuleError)
    assert error.value.code == "invalid_rules"
    assert str(error.value).splitlines() == [
        f"{path}:2: rules[0]: missing field 'match'",
        f"{path}:4: rules[0]: unknown field 'colour'",
    ]


def test_a_folder_is_read_in_name_order_and_not_recursively(tmp_path):
    write(tmp_path, "b.yml", GOOD.replace("payments.charge", "second"))
    write(tmp_path, "a.yaml", GOOD.replace("payments.charge", "first"))
    write(tmp_path, "notes.txt", "not rules")
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "c.yaml", GOOD.replace("payments.charge", "nested"))
    rules = load_rules([tmp_path])
    assert [rule.name for rule in rules] == ["first", "second"]


def test_a_file_given_twice_is_read_once(tmp_path):
    path = write(tmp_path, "a.yaml", GOOD)
    assert len(load_rules([tmp_path, path])) == 1


def test_missing_paths_empty_folders_and_other_files_are_problems(tmp_path):
    (tmp_path / "empty").mkdir()
    other = write(tmp_path, "rules.json", "{}")
    with pytest.raises(RuleError) as error:
        load_rules([tmp_path / "nope.yaml", tmp_path / "empty", other])
    assert [str(p) for p in error.value.problems] == [
        f"{tmp_path / 'nope.yaml'}: no such file or folder",
        f"{tmp_path / 'empty'}: no .yaml or .yml files in this folder",
        f"{other}: not a .yaml or .yml file",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "rules.yaml:1: the file is empty; expected a mapping with 'rules'"),
        ("- a\n- b\n", "rules.yaml:1: expected a mapping with the key 'rules'"),
        ("version: 2\nrules: []\n", "rules.yaml:1: version: input should be 1, got 2"),
        ("rules: {a: 1}\n", "rules.yaml:1: rules: input should be a valid list, got {'a': 1}"),
    ],
)
def test_the_top_level_must_be_rules_and_an_optional_version(tmp_path, text, expected):
    assert only_problem(tmp_path, text) == expected


def test_yaml_anchors_and_merge_keys_work(tmp_path):
    text = """\
    rules:
      - name: a
        match: &stripe {host: api.stripe.com, method: GET}
        effect: read
      - name: b
        match:
          <<: *stripe
          method: DELETE
        effect: idempotent
    """
    rules = load_rules([write(tmp_path, "rules.yaml", text)])
    assert rules.get("b").match.method == ("DELETE",)
    assert [h.source for h in rules.get("b").match.host] == ["api.stripe.com"]


def test_a_rule_problem_without_a_line_prints_just_the_file():
    assert str(RuleProblem(Path("x.yaml"), 0, "gone")) == "x.yaml: gone"
    assert str(RuleProblem(Path("x.yaml"), 3, "bad")) == "x.yaml:3: bad"


LAUGHS = (
    "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n"
        for p, n in zip("abcdefgh", "bcdefghi", strict=True)
    )
    + "rules: *i\n"
)


def test_aliases_expanding_beyond_a_bound_are_refused_with_file_and_line(tmp_path):
    """A 600-byte "billion laughs" once ran for 28 s and died of MemoryError."""
    found = only_problem(tmp_path, LAUGHS)
    assert found.startswith("rules.yaml:1: invalid YAML: the file expands to more than")


def test_an_alias_into_itself_is_refused(tmp_path):
    found = only_problem(tmp_path, "rules: &r [*r]\n")
    assert found == (
        "rules.yaml:1: invalid YAML: an alias here refers to a value that contains it: refused"
    )


def test_merge_keys_through_aliases_still_work(tmp_path):
    text = """\
        rules:
          - &first {name: first, match: {host: a.test, method: POST}, effect: non_idempotent}
          - <<: *first
            name: second
        """
    found = load_rules([write(tmp_path, "rules.yaml", text)])
    assert [rule.name for rule in found] == ["first", "second"]


def test_an_unknown_secret_parameter_is_refused_at_its_line(tmp_path):
    text = """\
    rules:
      - name: telegram.send
        match: {host: api.telegram.org, method: POST, path: "/bot{token}/sendMessage"}
        effect: non_idempotent
        redact:
          params:
            - token
            - chat
    """
    assert only_problem(tmp_path, text) == (
        "rules.yaml:8: rules[0].redact.params[1]: "
        "'chat' is not a parameter of match.path (it has: token)"
    )
