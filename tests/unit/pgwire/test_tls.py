"""The relay's own certificates: one per name the agent asks for, from the sidecar's CA."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import ssl
import struct
import time

import pytest
from cryptography import x509

from sidecar.pgwire.codec import SSL_REQUEST
from sidecar.pgwire.relay import Relay, Upstream
from sidecar.pgwire.tls import LeafContext, RelayCertificates, host_name
from sidecar.proxy.ca import Authority, ensure_authority


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    return ensure_authority(tmp_path_factory.mktemp("sidecar"))


@pytest.fixture
def certificates(authority: Authority) -> RelayCertificates:
    return RelayCertificates.from_confdir(authority.confdir, authority.cert)


@pytest.mark.parametrize(
    ("asked", "name"),
    [
        ("DB.Internal", "db.internal"),
        ("db.internal.", "db.internal"),
        ("localhost", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("0:0::1", "::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("*.example.com", "*.example.com"),
        ("", None),
        ("bad name", None),
        ("-leading.example", None),
        ("x" * 64 + ".example", None),
        ("a." * 130 + "example", None),
        ("inj\0ected", None),
    ],
)
def test_only_names_a_certificate_can_hold_are_issued_for(asked: str, name: str | None) -> None:
    assert host_name(asked) == name


async def handshake(
    certificates: RelayCertificates,
    authority: Authority,
    default: str,
    sni: str | None,
    *,
    check: bool = True,
    strict: bool = False,
) -> x509.Certificate:
    """A real TLS handshake over loopback: the relay's side starts with the leaf for
    ``default``; the client sends ``sni`` (None: no SNI) and verifies with the bundle."""
    presented: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await writer.start_tls(certificates.context_for(default))
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ssl.create_default_context(cafile=str(authority.bundle))
    client.check_hostname = check and sni is not None
    if strict:
        client.verify_flags |= ssl.VERIFY_X509_STRICT
    async with server:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client, server_hostname=sni or ""
        )
        ssl_object = writer.get_extra_info("ssl_object")
        presented.set_result(ssl_object.getpeercert(binary_form=True))
        writer.close()
    return x509.load_der_x509_certificate(await presented)


def names(cert: x509.Certificate) -> list[object]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return [*san.get_values_for_type(x509.DNSName), *san.get_values_for_type(x509.IPAddress)]


async def test_the_leaf_names_the_host_the_agent_asked_for_and_verifies_with_the_bundle(
    certificates: RelayCertificates, authority: Authority
) -> None:
    cert = await handshake(certificates, authority, "127.0.0.1", "db.internal")
    assert names(cert) == ["db.internal"]
    ca = x509.load_pem_x509_certificate(authority.cert.read_bytes())
    assert cert.issuer == ca.subject
    assert certificates.cached() == ["127.0.0.1", "db.internal"]


async def test_without_sni_the_leaf_names_the_address_the_agent_connected_to(
    certificates: RelayCertificates, authority: Authority
) -> None:
    cert = await handshake(certificates, authority, "127.0.0.1", None)
    assert names(cert) == [ipaddress.ip_address("127.0.0.1")]  # an IP SAN, not a DNS one


async def test_an_sni_no_certificate_can_hold_keeps_the_default(
    certificates: RelayCertificates, authority: Authority
) -> None:
    cert = await handshake(certificates, authority, "127.0.0.1", "bad name", check=False)
    assert names(cert) == [ipaddress.ip_address("127.0.0.1")]
    assert certificates.cached() == ["127.0.0.1"]


def test_leaves_are_cached_per_name_and_the_cache_is_bounded(authority: Authority) -> None:
    certificates = RelayCertificates.from_confdir(authority.confdir, authority.cert, cache_size=3)
    first = certificates.context_for("a.example")
    assert certificates.context_for("a.example") is first
    assert isinstance(first, LeafContext)
    assert first.name == "a.example"
    assert certificates.issued == 1
    for name in ("b.example", "c.example", "d.example"):
        certificates.context_for(name)
    assert certificates.cached() == ["b.example", "c.example", "d.example"]  # LRU: a left
    assert certificates.context_for("a.example") is not first
    assert certificates.issued == 5


async def test_the_leaf_passes_strict_verification_and_is_a_server_certificate(
    certificates: RelayCertificates, authority: Authority
) -> None:
    """Python 3.13's VERIFY_X509_STRICT (an AKI, ...) is asked for explicitly here."""
    cert = await handshake(certificates, authority, "127.0.0.1", "localhost", strict=True)
    ca = x509.load_pem_x509_certificate(authority.cert.read_bytes())
    assert cert.not_valid_after_utc <= ca.not_valid_after_utc
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)


# ---- the relay's handshake: timeouts and garbage ------------------------------------------


async def _relay(certificates: RelayCertificates, timeout_s: float) -> tuple[Relay, int]:
    async def never(*_: object) -> None:
        raise AssertionError("no session may start")

    relay = Relay(
        Upstream("127.0.0.1", 9, tls=False),  # discard: never reached by these clients
        never,
        authentication_timeout_s=timeout_s,
        certificates=certificates,
    )
    _, port = await relay.start("127.0.0.1", 0)
    return relay, port


async def test_a_client_that_starts_tls_and_stalls_is_closed_by_the_authentication_timeout(
    certificates: RelayCertificates,
) -> None:
    relay, port = await _relay(certificates, 0.5)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack("!ii", 8, SSL_REQUEST))
        # The discard port refuses: the relay still answers S, to tell the agent over TLS.
        assert await reader.readexactly(1) == b"S"
        started = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing plaintext
        assert time.monotonic() - started < 3
        writer.close()
    finally:
        await relay.stop()


async def test_garbage_instead_of_a_client_hello_gets_a_clean_close(
    certificates: RelayCertificates, caplog: pytest.LogCaptureFixture
) -> None:
    relay, port = await _relay(certificates, 10)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack("!ii", 8, SSL_REQUEST))
        assert await reader.readexactly(1) == b"S"
        writer.write(b"GET / HTTP/1.1\r\n\r\n" * 10)
        answer = await asyncio.wait_for(reader.read(), 5)
        assert b"sidecar" not in answer  # a TLS alert at most, never a plaintext message
        writer.close()
    finally:
        await relay.stop()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
