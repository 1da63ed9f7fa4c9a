"""The isolation package's pure parts: namespace rules, hosts/resolv, the JKS trust store,
and the Java/Node knobs of the agent's environment."""

from __future__ import annotations

import struct
from datetime import UTC, datetime

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from sidecar.agent.isolation import jks, resolv
from sidecar.agent.isolation.rules import REFUSED_PORT, namespace_rules
from sidecar.agent.leasekeeper import Held
from sidecar.agent.worker import agent_environment
from tests.support import certs


def test_rules_redirect_http_and_pg_keep_mirrors_and_refuse_the_rest() -> None:
    text = namespace_rules(http_port=4000, pg_port=4001, pg_ports=(5432, 6543), mirrored=[7301])
    assert "-A OUTPUT -p tcp -d 127.0.0.0/8 --dport 7301 -j RETURN" in text
    assert "-A OUTPUT -p tcp --dport 6543 -j REDIRECT --to-ports 4001" in text
    assert "-A OUTPUT -p tcp --dport 443 -j REDIRECT --to-ports 4000" in text
    refuse = f"-A OUTPUT -p tcp ! -d 127.0.0.0/8 -j REDIRECT --to-ports {REFUSED_PORT}"
    lines = text.splitlines()
    assert lines.index(refuse) > lines.index(
        "-A OUTPUT -p tcp --dport 80 -j REDIRECT --to-ports 4000"
    )
    assert "-A OUTPUT -j REJECT" in text
    assert "5432" not in namespace_rules(http_port=4000, pg_port=None)


def test_routed_names_get_standin_addresses_first_and_dns_goes_to_the_relay() -> None:
    routed = resolv.routed_addresses(["b.test", "a.test", "a.test"])
    assert routed == {"198.18.0.1": "a.test", "198.18.0.2": "b.test"}
    hosts = resolv.hosts_text(routed, "127.0.0.1 localhost\n")
    assert hosts.splitlines() == ["198.18.0.1 a.test", "198.18.0.2 b.test", "127.0.0.1 localhost"]
    conf = "search corp\nnameserver 10.0.0.53\nnameserver ::1\n"
    assert resolv.nameservers(conf) == ["10.0.0.53"]
    assert resolv.resolv_text(conf) == "nameserver 127.0.0.1\nsearch corp\n"


def test_jks_holds_every_certificate_of_the_bundle() -> None:
    first, _ = certs.make_ca("one")
    second, _ = certs.make_ca("two")
    data = jks.jks_bytes(first.public_bytes(Encoding.PEM) + second.public_bytes(Encoding.PEM))
    assert struct.unpack(">III", data[:12]) == (0xFEEDFEED, 2, 2)
    assert first.public_bytes(Encoding.DER) in data
    assert second.public_bytes(Encoding.DER) in data


def test_a_bundle_is_read_as_its_certificates_whatever_text_is_around_them() -> None:
    first, _ = certs.make_ca("one")
    second, _ = certs.make_ca("two")
    bundle = (
        b"# Issuer: CN=one\n" + first.public_bytes(Encoding.PEM).replace(b"\n", b"\r\n")
        + b"\n# Issuer: CN=two\n" + second.public_bytes(Encoding.PEM) + b"\n"
    )  # fmt: skip
    assert jks.certificates_der(bundle) == [
        first.public_bytes(Encoding.DER),
        second.public_bytes(Encoding.DER),
    ]


def test_a_bundle_without_a_certificate_is_refused() -> None:
    with pytest.raises(ValueError, match="no PEM certificate"):
        jks.certificates_der(b"# nothing here\n")


def test_a_certificate_that_is_not_base64_is_refused() -> None:
    first, _ = certs.make_ca("one")
    pem = first.public_bytes(Encoding.PEM)
    damaged = pem.replace(b"\n", b"\n%\n", 3)  # a character base64 does not have
    with pytest.raises(ValueError, match="base64"):  # binascii.Error is a ValueError
        jks.certificates_der(damaged)


def held() -> Held:
    return Held(task="312", attempt_id="att-1", generation=1, expires_at=datetime.now(UTC))


def test_java_and_node_knobs() -> None:
    base = {"JAVA_TOOL_OPTIONS": "-Xmx1g"}
    plain = agent_environment(
        base, "http://127.0.0.1:7301", "/b.pem", held(), java_trust_store="/t.jks"
    )
    assert plain["NODE_USE_ENV_PROXY"] == "1"
    java = plain["JAVA_TOOL_OPTIONS"]
    assert java.startswith("-Xmx1g -Dhttp.proxyHost=127.0.0.1 -Dhttp.proxyPort=7301")
    assert "-Djdk.http.auth.tunneling.disabledSchemes=" in java
    assert "-Djavax.net.ssl.trustStore=/t.jks" in java
    isolated = agent_environment(
        {}, "http://127.0.0.1:7301", "/b.pem", held(), java_trust_store="/t.jks", isolated=True
    )
    assert "proxyHost" not in isolated["JAVA_TOOL_OPTIONS"]
    assert "-Djavax.net.ssl.trustStoreType=JKS" in isolated["JAVA_TOOL_OPTIONS"]
