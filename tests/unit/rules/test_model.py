"""The rule schema: defaults, normalisation, and the checks that keep a rule coherent."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sidecar.rules import EffectKind, OnDivergence, OnUnknown, Rule, RuleFile
from sidecar.rules.model import FieldProblem

PROBE = {
    "request": {"path": "/repos/{owner}/{repo}/pulls?head={owner}:{body.head}"},
    "found": "length(@) > `0`",
    "answer": {"status": 201, "body": "[0]"},
}


def rule(**fields):
    base = {
        "name": "github.pulls.create",
        "match": {
            "host": "api.github.com",
            "method": "POST",
            "path": "/repos/{owner}/{repo}/pulls",
        },
        "effect": "non_idempotent",
    }
    return Rule.model_validate(base | fields)


def problem(**fields) -> tuple[tuple[str, ...], str]:
    with pytest.raises(ValidationError) as error:
        rule(**fields)
    cause = error.value.errors()[0]["ctx"]["error"]
    assert isinstance(cause, FieldProblem)
    return cause.field, str(cause)


def test_defaults_are_the_conservative_ones():
    made = rule()
    assert made.on_unknown is OnUnknown.BLOCK
    assert made.on_divergence is OnDivergence.REPLAY
    assert made.max_body_bytes == 1 << 20
    assert made.timeout_s == 30
    assert made.key is None
    assert made.probe is None
    assert made.logged


def test_single_values_become_lists_and_methods_upper_case():
    made = rule(match={"host": ["a.com", "*.b.com"], "method": ["post", "put"]})
    assert [h.source for h in made.match.host] == ["a.com", "*.b.com"]
    assert made.match.method == ("POST", "PUT")
    assert rule(match={"host": "a.com"}).match.method is None  # any method


def test_header_conditions_are_keyed_by_lower_case_name():
    made = rule(match={"host": "a.com", "headers": {"X-Kind": "charge"}})
    assert made.match.headers == {"x-kind": "charge"}


def test_a_full_rule_round_trips_through_its_dump():
    made = rule(
        key="{owner}/{repo}#pull:{body.head}->{body.base}",
        on_unknown="probe",
        probe=PROBE,
        checkpoint={"stage": "OPEN_PR", "outputs": {"pr_url": "html_url"}},
    )
    assert Rule.model_validate(made.model_dump()) == made
    dumped = made.model_dump(mode="json")
    assert dumped["probe"]["found"] == "length(@) > `0`"
    assert dumped["probe"]["found_status"] == [200]
    assert dumped["match"]["path"] == "/repos/{owner}/{repo}/pulls"


def test_rules_are_frozen_and_refuse_unknown_fields():
    made = rule()
    with pytest.raises(ValidationError):
        made.effect = EffectKind.READ
    with pytest.raises(ValidationError, match="extra"):
        rule(colour="blue")


@pytest.mark.parametrize("name", ["GitHub", "-x", "a b", "a/b", ""])
def test_rule_names_are_lower_case_identifiers(name):
    with pytest.raises(ValidationError, match="not a rule name"):
        rule(name=name)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("timeout_s", 0),
        ("timeout_s", 601),
        ("max_body_bytes", 0),
        ("idempotency_header", "Bad Header"),
        ("effect", "write"),
        ("on_unknown", "ask"),
    ],
)
def test_out_of_range_values_are_refused(field, value):
    with pytest.raises(ValidationError):
        rule(**{field: value})


def test_on_unknown_probe_needs_a_probe():
    field, message = problem(on_unknown="probe")
    assert field == ("on_unknown",)
    assert "needs a 'probe' section" in message


def test_a_probe_is_only_used_with_on_unknown_probe():
    field, message = problem(probe=PROBE, on_unknown="retry")
    assert field == ("probe",)
    assert "on_unknown: retry" in message


@pytest.mark.parametrize("effect", ["read", "idempotent"])
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("probe", PROBE),
        ("idempotency_header", "Idempotency-Key"),
        ("checkpoint", {"stage": "S"}),
        ("redact", {"params": ["owner"]}),
    ],
)
def test_write_only_settings_are_refused_on_reads(effect, field, value):
    extra = {"on_unknown": "probe"} if field == "probe" else {}
    found, message = problem(effect=effect, **{field: value}, **extra)
    assert found == (field,)
    assert f"this rule's effect is {effect}" in message


def test_a_key_may_only_name_parameters_of_the_path():
    field, message = problem(key="{ownr}/{repo}")
    assert field == ("key",)
    assert "{ownr} is not a parameter of match.path" in message
    assert rule(key="{method} {host} {path} {owner}").key is not None


def test_probe_templates_may_only_name_parameters_of_the_path():
    bad = PROBE | {"request": {"path": "/x/{nope}"}}
    assert problem(on_unknown="probe", probe=bad)[0] == ("probe", "request", "path")
    bad = PROBE | {"request": {"path": "/x", "headers": {"X-A": "{nope}"}}}
    assert problem(on_unknown="probe", probe=bad)[0] == ("probe", "request", "headers", "x-a")


def test_jmespath_in_probes_and_checkpoints_is_compiled_when_loading():
    for bad in (
        PROBE | {"found": "length(@"},
        PROBE | {"answer": {"status": 201, "body": "[0"}},
    ):
        with pytest.raises(ValidationError, match="invalid JMESPath"):
            rule(on_unknown="probe", probe=bad)
    with pytest.raises(ValidationError, match="invalid JMESPath"):
        rule(checkpoint={"stage": "S", "outputs": {"url": "a..b"}})


def test_probe_answers_need_a_real_status():
    with pytest.raises(ValidationError, match="less than or equal to 599"):
        rule(on_unknown="probe", probe=PROBE | {"answer": {"status": 2010}})


def test_a_rule_file_is_rules_and_an_optional_version():
    assert RuleFile.model_validate({"rules": []}).version == 1
    with pytest.raises(ValidationError):
        RuleFile.model_validate({"version": 2, "rules": []})
    with pytest.raises(ValidationError):
        RuleFile.model_validate({"rule": []})


def test_redact_names_secret_path_parameters_and_answer_fields():
    made = rule(redact={"params": ["repo"], "response": ["client_secret", "credentials.password"]})
    assert made.redact.params == ("repo",)
    assert made.redact.response == (("client_secret",), ("credentials", "password"))
    assert Rule.model_validate(made.model_dump()) == made
    assert made.model_dump(mode="json")["redact"]["response"] == [
        "client_secret",
        "credentials.password",
    ]
    assert rule().redact.params == ()


def test_a_secret_must_be_a_parameter_of_the_path():
    field, message = problem(redact={"params": ["owner", "tokn"]})
    assert field == ("redact", "params", 1)
    assert message == "'tokn' is not a parameter of match.path (it has: owner, repo)"


@pytest.mark.parametrize("bad", ["", "a..b", ".a", 7])
def test_answer_fields_are_names_or_dotted_paths(bad):
    with pytest.raises(ValidationError, match="field name"):
        rule(redact={"response": [bad]})


def test_redact_does_not_apply_to_sql_or_git_pushes():
    sql = {"name": "s", "match": {"sql": {"kind": "ALTER"}}, "effect": "non_idempotent"}
    with pytest.raises(ValidationError, match="'redact' is for HTTP rules"):
        Rule.model_validate(sql | {"redact": {"response": ["x"]}})
    git = {"protocol": "git-receive-pack", "redact": {"params": ["repo"]}}
    field, message = problem(**git)
    assert field == ("redact",)
    assert "does not apply to git pushes" in message
