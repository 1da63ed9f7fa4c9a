"""The transparent-mode redirect rules, as text (no iptables needed)."""

from __future__ import annotations

import argparse
import ipaddress

import pytest

from sidecar.cli import redirect as verb
from sidecar.errors import ConfigError
from sidecar.kube.redirect import (
    CHAIN,
    CHAIN6,
    REDIRECT_CHAIN,
    Redirect,
    RedirectError,
    has_hook,
    hook_rule,
    ipv6_rules,
    nat_rules,
)


def rules_of(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("-A ")]


def test_defaults_redirect_http_https_and_postgresql_except_loopback_and_the_sidecar() -> None:
    text = nat_rules(Redirect.parse())
    assert text.startswith("*nat\n")
    assert text.endswith("COMMIT\n")
    assert f":{CHAIN} - [0:0]" in text
    assert f"-F {CHAIN}" in text
    assert f"-F {REDIRECT_CHAIN}" in text
    assert rules_of(text) == [
        f"-A {CHAIN} -o lo -j RETURN",
        f"-A {CHAIN} -m owner --uid-owner 1337 -j RETURN",
        f"-A {CHAIN} -d 127.0.0.0/8 -j RETURN",
        f"-A {CHAIN} -j {REDIRECT_CHAIN}",
        f"-A {REDIRECT_CHAIN} -p tcp --dport 5432 -j REDIRECT --to-ports 7302",
        f"-A {REDIRECT_CHAIN} -p tcp --dport 80 -j REDIRECT --to-ports 7301",
        f"-A {REDIRECT_CHAIN} -p tcp --dport 443 -j REDIRECT --to-ports 7301",
        f"-A OUTPUT -p tcp -j {CHAIN}",
    ]


def test_exclusions_come_before_any_redirect() -> None:
    text = nat_rules(
        Redirect.parse(exclude_cidrs="10.0.0.0/8, 169.254.169.254", exclude_ports="22,8443")
    )
    rules = rules_of(text)
    jump = rules.index(f"-A {CHAIN} -j {REDIRECT_CHAIN}")
    for rule in [
        f"-A {CHAIN} -d 10.0.0.0/8 -j RETURN",
        f"-A {CHAIN} -d 169.254.169.254/32 -j RETURN",
        f"-A {CHAIN} -p tcp --dport 22 -j RETURN",
        f"-A {CHAIN} -p tcp --dport 8443 -j RETURN",
    ]:
        assert rules.index(rule) < jump


def test_include_cidrs_limit_what_is_redirected() -> None:
    rules = rules_of(nat_rules(Redirect.parse(include_cidrs="140.82.112.0/20,10.1.0.0/16")))
    assert f"-A {CHAIN} -d 140.82.112.0/20 -j {REDIRECT_CHAIN}" in rules
    assert f"-A {CHAIN} -d 10.1.0.0/16 -j {REDIRECT_CHAIN}" in rules
    assert f"-A {CHAIN} -j {REDIRECT_CHAIN}" not in rules


def test_every_port_with_star_still_sends_postgresql_to_its_listener_first() -> None:
    rules = rules_of(nat_rules(Redirect.parse(include_ports="*", pg_ports="5432,6432")))
    tail = [r for r in rules if r.startswith(f"-A {REDIRECT_CHAIN}")]
    assert tail == [
        f"-A {REDIRECT_CHAIN} -p tcp --dport 5432 -j REDIRECT --to-ports 7302",
        f"-A {REDIRECT_CHAIN} -p tcp --dport 6432 -j REDIRECT --to-ports 7302",
        f"-A {REDIRECT_CHAIN} -p tcp -j REDIRECT --to-ports 7301",
    ]


def test_custom_ports_uid_and_no_postgresql() -> None:
    redirect = Redirect.parse(
        proxy_port=15001, pg_port=15002, owner_uid=101, pg_ports="", include_ports="443"
    )
    rules = rules_of(nat_rules(redirect))
    assert f"-A {CHAIN} -m owner --uid-owner 101 -j RETURN" in rules
    assert [r for r in rules if "REDIRECT --to-ports" in r] == [
        f"-A {REDIRECT_CHAIN} -p tcp --dport 443 -j REDIRECT --to-ports 15001"
    ]


def test_run_twice_is_idempotent_the_hook_is_only_added_once() -> None:
    listing = f"-P OUTPUT ACCEPT\n{hook_rule()}\n"
    assert has_hook(listing)
    assert not has_hook("-P OUTPUT ACCEPT\n")
    assert not has_hook(f"-A OUTPUT -p tcp -j {CHAIN}_OTHER\n")
    again = nat_rules(Redirect.parse(), hook=False)
    assert "-A OUTPUT" not in again
    assert f"-F {CHAIN}" in again  # our chains are flushed, so nothing doubles


def test_ipv6_fails_closed_on_the_redirected_ports() -> None:
    text = ipv6_rules(Redirect.parse(exclude_cidrs="fd00::/8,10.0.0.0/8"))
    assert text.startswith("*filter\n")
    rules = rules_of(text)
    assert rules == [
        f"-A {CHAIN6} -o lo -j RETURN",
        f"-A {CHAIN6} -m owner --uid-owner 1337 -j RETURN",
        f"-A {CHAIN6} -d ::1/128 -j RETURN",
        f"-A {CHAIN6} -d fd00::/8 -j RETURN",
        f"-A {CHAIN6} -p tcp --dport 5432 -j REJECT --reject-with tcp-reset",
        f"-A {CHAIN6} -p tcp --dport 80 -j REJECT --reject-with tcp-reset",
        f"-A {CHAIN6} -p tcp --dport 443 -j REJECT --reject-with tcp-reset",
        f"-A OUTPUT -p tcp -j {CHAIN6}",
    ]
    # IPv4 networks stay out of the IPv6 rules and the other way round.
    assert "fd00::/8" not in nat_rules(Redirect.parse(exclude_cidrs="fd00::/8"))


def test_ipv6_with_only_ipv4_include_cidrs_resets_nothing() -> None:
    rules = rules_of(ipv6_rules(Redirect.parse(include_cidrs="10.0.0.0/8")))
    assert not [r for r in rules if "REJECT" in r]
    star = rules_of(ipv6_rules(Redirect.parse(include_ports="*")))
    assert f"-A {CHAIN6} -p tcp -j REJECT --reject-with tcp-reset" in star


def test_parsed_values_are_deduplicated_and_typed() -> None:
    redirect = Redirect.parse(exclude_ports="22, 22,,23", exclude_cidrs="10.0.0.1")
    assert redirect.exclude_ports == (22, 23)
    assert redirect.exclude_cidrs == (ipaddress.ip_network("10.0.0.1/32"),)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"proxy_port": 0}, "--proxy-port: 0 is not a TCP port"),
        ({"pg_port": 70000}, "--pg-port: 70000 is not a TCP port"),
        ({"proxy_port": 7301, "pg_port": 7301}, "must differ"),
        ({"owner_uid": 0}, "uid 0 would exempt every root process"),
        ({"owner_uid": -5}, "--owner-uid -5"),
        ({"pg_ports": "5432,abc"}, "--pg-ports: 'abc' is not a port number"),
        ({"include_ports": "443,99999"}, "--include-ports: 99999 is not a TCP port"),
        ({"include_ports": " , "}, "--include-ports is empty"),
        ({"exclude_ports": "-1"}, "--exclude-ports: '-1' is not a port number"),
        ({"include_cidrs": "10.0.0.0/33"}, "--include-cidrs: '10.0.0.0/33' is not"),
        ({"exclude_cidrs": "github.com"}, "--exclude-cidrs: 'github.com' is not"),
        ({"pg_ports": "443"}, "port(s) 443 in both --pg-ports and --include-ports"),
    ],
)
def test_bad_settings_are_refused_naming_the_flag(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(RedirectError) as caught:
        Redirect.parse(**settings)  # type: ignore[arg-type]
    assert message in str(caught.value)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="sidecar")
    verb.register(parser.add_subparsers(dest="verb", required=True))
    return parser.parse_args(["redirect", *argv])


def test_the_verb_dry_run_prints_both_tables(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(
        "--proxy-port", "7301", "--pg-port", "7302", "--owner-uid", "1337",
        "--pg-ports", "5432", "--include-cidrs", "10.0.0.0/8", "--exclude-cidrs", "10.9.0.0/16",
        "--include-ports", "80,443", "--exclude-ports", "22", "--dry-run",
    )  # fmt: skip
    assert verb.run(args) == 0
    out = capsys.readouterr().out
    assert out == nat_rules(
        Redirect.parse(include_cidrs="10.0.0.0/8", exclude_cidrs="10.9.0.0/16", exclude_ports="22")
    ) + ipv6_rules(
        Redirect.parse(include_cidrs="10.0.0.0/8", exclude_cidrs="10.9.0.0/16", exclude_ports="22")
    )


def test_the_verb_refuses_bad_flags_as_a_config_error() -> None:
    with pytest.raises(ConfigError, match="--owner-uid 0"):
        verb.run(parse("--owner-uid", "0", "--dry-run"))


def test_the_verb_says_which_tool_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verb.shutil, "which", lambda _name: None)
    with pytest.raises(ConfigError, match=r"iptables is not installed \(Debian: apt-get"):
        verb.run(parse())
