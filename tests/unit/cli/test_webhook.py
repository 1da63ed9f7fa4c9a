"""``sidecar webhook``'s options: ``--reload-s`` (how often the certificate is checked)."""

from __future__ import annotations

import argparse

import pytest

from sidecar.cli import webhook


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    webhook.register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["webhook", "--tls-cert", "c", "--tls-key", "k", *argv])


def test_the_certificate_is_checked_every_10_seconds_by_default():
    assert parse().reload_s == 10.0


def test_reload_s_takes_fractions_of_a_second():
    assert parse("--reload-s", "0.5").reload_s == 0.5


@pytest.mark.parametrize("value", ["0", "-1", "nan", "soon"])
def test_reload_s_must_be_a_positive_number(value, capsys):
    with pytest.raises(SystemExit):
        parse("--reload-s", value)
    assert "--reload-s" in capsys.readouterr().err
