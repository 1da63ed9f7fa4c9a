"""What the relay takes from its configuration and from each agent's start-up packet."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.pgwire.relay import Upstream, split_binding
from sidecar.recording.bindings import BindRequest


def test_the_upstream_is_a_postgresql_url_without_credentials() -> None:
    assert Upstream.parse("postgresql://db.internal:6543") == Upstream("db.internal", 6543, False)
    assert Upstream.parse("postgres://db") == Upstream("db", 5432, False)
    assert Upstream.parse("postgresql://db/?sslmode=require").tls


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://db", "postgresql://HOST"),
        ("postgresql://user:secret@db", "no credentials"),
        ("postgresql://db?sslmode=prefer", "sslmode must be one of disable, require"),
    ],
)
def test_a_bad_upstream_is_refused_with_what_to_write(url: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Upstream.parse(url)


def test_tls_to_the_server_on_every_connection_or_only_when_the_agent_asks() -> None:
    asked = Upstream.parse("postgresql://db")
    assert not asked.tls  # TLS to the server exactly when the agent's link is TLS ...
    assert asked.verification == "verify-full"  # ... then verified, name and chain
    assert Upstream.parse("postgresql://db?sslmode=disable").verification == "verify-full"
    required = Upstream.parse("postgresql://db?sslmode=require")
    assert (required.tls, required.verification) == (True, "none")  # as today
    assert Upstream.parse("postgresql://db?sslmode=verify-ca").verification == "verify-ca"
    assert Upstream.parse("postgresql://db?sslmode=verify-full").verification == "verify-full"


def test_the_servers_ca_comes_from_the_option_or_the_url_as_libpq_writes_it() -> None:
    ca = Path("/etc/db/ca.pem")
    assert Upstream.parse("postgresql://db", ca).ca == ca
    assert Upstream.parse("postgresql://db?sslrootcert=/etc/db/ca.pem").ca == ca
    assert Upstream.parse("postgresql://db?sslrootcert=system").ca is None
    # sslmode=require with a CA verifies the chain, as libpq does with a root file.
    assert Upstream.parse("postgresql://db?sslmode=require", ca).verification == "verify-ca"
    with pytest.raises(ConfigError, match="given twice"):
        Upstream.parse("postgresql://db?sslrootcert=/other.pem", ca)


def test_an_unreadable_server_ca_stops_start_up_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(ConfigError, match="--pg-upstream-ca: cannot read CA certificates from"):
        Upstream.parse("postgresql://db", bad).client_context()


def test_the_secret_never_appears_in_the_refusal() -> None:
    with pytest.raises(ConfigError) as refused:
        Upstream.parse("postgresql://user:hunter2@db")
    assert "hunter2" not in str(refused.value)


def test_pgoptions_binding_is_taken_out_and_the_rest_of_options_kept() -> None:
    forwarded, bind = split_binding(
        {
            "user": "app",
            "database": "shop",
            "options": "-c statement_timeout=5s -c sidecar.task=312 -c sidecar.attempt=att-1",
        }
    )
    assert bind == BindRequest("312", "att-1", "pg")
    assert forwarded == {"user": "app", "database": "shop", "options": "-c statement_timeout=5s"}


def test_binding_as_startup_parameters_as_asyncpg_sends_them() -> None:
    forwarded, bind = split_binding(
        {"user": "app", "sidecar.task": "312", "sidecar.attempt": "att-2"}
    )
    assert bind == BindRequest("312", "att-2", "pg")
    assert forwarded == {"user": "app"}


def test_options_holding_only_the_binding_are_dropped_entirely() -> None:
    forwarded, bind = split_binding({"user": "app", "options": "-c sidecar.task=9"})
    assert bind == BindRequest("9", None, "pg")
    assert "options" not in forwarded


def test_no_binding_at_all() -> None:
    forwarded, bind = split_binding({"user": "app", "application_name": "psql"})
    assert bind == BindRequest(None, None, "pg")
    assert forwarded == {"user": "app", "application_name": "psql"}
