"""``sidecar webhook``'s options: ``--reload-s`` (how often the certificate is checked), and
the choice of TLS source: files, or self-signed with its settings."""

from __future__ import annotations

import argparse

import pytest

from sidecar.cli import webhook
from sidecar.errors import ConfigError
from sidecar.kube import apiclient, certgen, selfsigned


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


def parse_only(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    webhook.register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["webhook", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "give --tls-cert and --tls-key, or --self-signed-secret and --cert-dir"),
        (("--tls-cert", "c"), "give --tls-cert and --tls-key"),
        (("--self-signed-secret", "s"), "--self-signed-secret needs --cert-dir"),
        (("--self-signed-secret", "s", "--cert-dir", "d", "--tls-key", "k"), "not both"),
    ],
)
def test_one_complete_tls_source_is_required(argv, message):
    with pytest.raises(ConfigError, match=message):
        webhook.tls_mode(parse_only(*argv))


def test_the_self_signed_settings_come_from_the_options(tmp_path):
    args = parse_only(
        "--self-signed-secret",
        "webhook-tls",
        "--cert-dir",
        str(tmp_path),
        "--service",
        "hook.tools",
        "--renew-before-days",
        "10",
        "--kube-api",
        "https://127.0.0.1:6443",
        "--namespace",
        "system",
    )
    webhook.tls_mode(args)
    tls = webhook.self_signed_tls(args)
    assert tls.settings.names == ("hook.tools.svc", "hook.tools.svc.cluster.local")
    assert (tls.settings.namespace, tls.settings.secret) == ("system", "webhook-tls")
    assert tls.settings.configuration == "effect-sidecar"
    assert tls.settings.renew_before.days == 10
    assert tls.credentials.server == "https://127.0.0.1:6443"
    assert tls.credentials.token_file == apiclient.SERVICE_ACCOUNT / "token"
    assert (tls.cert, tls.key) == (tmp_path / "tls.crt", tmp_path / "tls.key")


def test_the_service_namespace_defaults_to_the_webhooks_own(tmp_path):
    args = parse_only(
        "--self-signed-secret", "s", "--cert-dir", str(tmp_path), "--namespace", "system"
    )
    args.kube_api = "https://127.0.0.1:6443"
    assert webhook.self_signed_tls(args).settings.names[0] == "effect-sidecar-webhook.system.svc"


def test_a_renewal_window_as_long_as_the_validity_is_refused(tmp_path):
    args = parse_only(
        "--self-signed-secret",
        "s",
        "--cert-dir",
        str(tmp_path),
        "--namespace",
        "system",
        "--kube-api",
        "https://127.0.0.1:6443",
        "--renew-before-days",
        "365",
    )
    with pytest.raises(ConfigError, match="renewal window"):
        webhook.self_signed_tls(args)


def test_outside_a_pod_the_api_must_be_named(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    args = parse_only("--self-signed-secret", "s", "--cert-dir", str(tmp_path), "--namespace", "n")
    with pytest.raises(ConfigError, match="give --kube-api"):
        webhook.self_signed_tls(args)


def test_the_cli_defaults_are_the_modules_own():
    """The CLI repeats them so as not to import the mode for --help."""
    assert webhook.DEFAULT_CONFIGURATION == selfsigned.DEFAULT_CONFIGURATION
    assert webhook.DEFAULT_SERVICE == selfsigned.DEFAULT_SERVICE
    assert webhook.DEFAULT_CHECK_S == selfsigned.DEFAULT_CHECK_S
    assert certgen.DEFAULT_RENEW_BEFORE.days == webhook.DEFAULT_RENEW_BEFORE_DAYS
    assert str(apiclient.SERVICE_ACCOUNT) == webhook.SERVICE_ACCOUNT
