"""One consistent CLI: the same flag names across verbs (old spellings still work, hidden),
``--config``/``SIDECAR_*`` for exec, and exit codes mapped in one place (SPEC §5)."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar import cli
from sidecar.cli import build_parser, exit_code, main
from sidecar.cli import exec as exec_
from sidecar.cli.control_client import problem_error
from sidecar.config import control_url
from sidecar.errors import (
    ConfigError,
    EffectUnknown,
    InvalidRequest,
    LeaseHeld,
    NotFound,
    NotWaitingForAHuman,
    SidecarError,
    SidecarUnreachable,
    StoreUnavailable,
)


@pytest.fixture(autouse=True)
def _no_sidecar_env(monkeypatch):
    for name in ("SIDECAR_CONTROL_LISTEN", "SIDECAR_CONTROL_TOKEN", "SIDECAR_LEASE_TTL_S"):
        monkeypatch.delenv(name, raising=False)


def parse(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(list(words))


def test_exec_takes_lease_ttl_s_like_serve(capsys):
    args = parse("exec", "--task", "t", "--lease-ttl-s", "9", "--", "true")
    _, settings, _ = exec_.control_of(args)
    assert settings.lease_ttl_s == 9
    assert capsys.readouterr().err == ""


def test_exec_ttl_s_is_a_hidden_deprecated_alias(capsys):
    args = parse("exec", "--task", "t", "--ttl-s", "7", "--", "true")
    _, settings, _ = exec_.control_of(args)
    assert settings.lease_ttl_s == 7
    assert "--ttl-s is deprecated; use --lease-ttl-s" in capsys.readouterr().err
    help_text = build_parser()._subparsers._group_actions[0].choices["exec"].format_help()  # type: ignore[union-attr]
    assert "--lease-ttl-s" in help_text
    assert "--ttl-s" not in help_text


def test_exec_default_lease_is_sixty_seconds():
    _, settings, _ = exec_.control_of(parse("exec", "--task", "t", "--", "true"))
    assert settings.lease_ttl_s == 60


@pytest.mark.parametrize(
    ("given", "url"),
    [
        ("127.0.0.1:7399", "http://127.0.0.1:7399"),
        ("http://127.0.0.1:7399/", "http://127.0.0.1:7399"),
        ("https://sidecar.example:443", "https://sidecar.example:443"),
    ],
)
def test_exec_control_takes_host_port_or_url(given, url):
    found, _, where = exec_.control_of(parse("exec", "--control", given, "--task", "t", "true"))
    assert (found, where) == (url, "--control")
    assert control_url(given) == url


def test_exec_reads_control_token_and_lease_from_config(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        f"control_listen: 0.0.0.0:7391\ncontrol_token_file: {token}\nlease_ttl_s: 12\n"
    )
    url, settings, where = exec_.control_of(
        parse("exec", "--config", str(config), "--task", "t", "--", "true")
    )
    assert url == "http://127.0.0.1:7391"  # serve on every address: reached on loopback
    assert where == f"control_listen of the config file {config}"
    assert settings.token() == "s3cret"
    assert settings.lease_ttl_s == 12


def test_exec_says_where_the_control_address_came_from(monkeypatch):
    args = parse("exec", "--task", "t", "--", "true")
    assert exec_.control_of(args)[::2] == ("http://127.0.0.1:7300", "the default control address")
    monkeypatch.setenv("SIDECAR_CONTROL_LISTEN", "[::1]:7392")
    assert exec_.control_of(args)[::2] == ("http://[::1]:7392", "SIDECAR_CONTROL_LISTEN")


def test_emulate_takes_data_dir_and_data_as_a_hidden_alias():
    new = parse("emulate", "github", "--data-dir", "/tmp/d")
    old = parse("emulate", "github", "--data", "/tmp/d")
    assert new.data_dir == Path("/tmp/d")
    assert old.data_dir is None
    assert old.deprecated_data == Path("/tmp/d")


def test_emulate_without_data_dir_is_a_usage_error(capsys):
    assert main(["emulate", "github"]) == 2
    assert "give --data-dir DIR" in capsys.readouterr().err


@pytest.mark.parametrize(
    "words",
    [
        ["tasks", "bad id"],
        ["effects", "bad id"],
        ["tasks", "x:1\n"],
        ["effects", "resolve", "bad/id", "k", "--as", "failed", "--note", "n"],
        ["exec", "--task", "x" * 129, "--", "true"],
        ["serve", "--task", "bad id"],
    ],
)
def test_a_bad_task_id_is_a_usage_error_for_every_verb(words, capsys):
    assert main(words) == 2
    assert "is not valid: 1-128 letters, digits" in capsys.readouterr().err


def test_exit_codes_come_from_one_table():
    held = LeaseHeld("t", "worker-b", "a-1", datetime(2030, 1, 1, tzinfo=UTC))
    assert exit_code(held) == 4
    assert exit_code(EffectUnknown("t", "k", "cannot determine")) == 3
    assert exit_code(StoreUnavailable("down")) == 5
    assert exit_code(SidecarUnreachable("nobody")) == 5
    assert exit_code(ConfigError("bad")) == 2
    assert exit_code(InvalidRequest("bad")) == 2
    assert exit_code(NotFound("task t has never been claimed")) == 1
    assert exit_code(NotWaitingForAHuman("t", "k", "completed", "settled")) == 1
    assert exit_code(SidecarError("other")) == 1


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (LeaseHeld("t", "worker-b", "a-1", datetime(2030, 1, 1, tzinfo=UTC)), 4),
        (EffectUnknown("t", "k", "cannot determine"), 3),
        (SidecarUnreachable("no sidecar answers at http://127.0.0.1:1"), 5),
        (InvalidRequest("ttl_s must be positive"), 2),
        (NotFound("task t has never been claimed"), 1),
    ],
)
def test_main_maps_what_any_verb_raises(monkeypatch, capsys, error, code):
    def run(_: argparse.Namespace) -> int:
        raise error

    parser = build_parser()
    args = parser.parse_args(["tasks", "t"])
    args.run = run
    monkeypatch.setattr(cli, "build_parser", lambda verb=None: _Fixed(args))
    assert main(["tasks", "t"]) == code
    assert capsys.readouterr().err == f"sidecar: {error.detail}\n"


class _Fixed:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def parse_args(self, _: object) -> argparse.Namespace:
        return self.args


def test_control_problems_become_the_errors_their_codes_name():
    held = problem_error(
        {
            "code": "lease_held",
            "task": "t",
            "holder": "worker-b",
            "holder_attempt_id": "a-1",
            "lease_expires_at": "2030-01-01T00:00:00+00:00",
        },
        409,
        "held",
    )
    assert isinstance(held, LeaseHeld)
    assert exit_code(held) == 4
    unknown = problem_error({"code": "effect_unknown", "task": "t", "effect_key": "k"}, 409, "?")
    assert exit_code(unknown) == 3
    assert exit_code(problem_error({"code": "not_found"}, 404, "no task")) == 1
    assert exit_code(problem_error({"code": "invalid_request"}, 422, "bad")) == 2
    assert exit_code(problem_error({"code": "store_unavailable"}, 503, "down")) == 5
    assert exit_code(problem_error({"code": "unauthorized"}, 401, "token")) == 2


def test_rules_check_fails_on_errors_not_on_warnings(tmp_path):
    warned = tmp_path / "warned.yaml"
    warned.write_text(
        "rules:\n  - name: a\n    match: {host: x.com, method: POST}\n    effect: non_idempotent\n"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("rules:\n  - name: b\n    match: {host: x.com, paht: /x}\n    effect: read\n")
    assert main(["rules", "check", str(warned)]) == 0
    assert main(["rules", "check", str(broken)]) == 1
