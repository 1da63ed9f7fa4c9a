"""TLS is opened only for hosts a rule or a route names; every other tunnel is raw bytes."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from sidecar.testing.served import ThreadedApp

pytestmark = pytest.mark.acceptance


def self_signed(directory: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pinned upstream")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "pinned.pem", directory / "pinned.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture
def pinned_upstream(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """An HTTPS server on 127.0.0.1 with its own self-signed certificate."""
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def hello(request: web.Request) -> web.Response:
        return web.json_response({"hello": "directly"})

    app = web.Application()
    app.router.add_get("/hello", hello)
    with ThreadedApp(app, ssl_context=context) as url:
        yield url, cert


def test_a_host_no_rule_names_is_tunnelled_without_interception(stack, pinned_upstream):
    url, cert = pinned_upstream
    proxies = {"https": stack.proxy_url}
    # The client trusts only the server's own certificate: this works only if the
    # sidecar relays the TLS bytes instead of presenting a certificate of its own CA.
    answer = requests.get(f"{url}/hello", proxies=proxies, verify=str(cert), timeout=30)
    assert answer.json() == {"hello": "directly"}
    assert "X-Sidecar-Effect" not in answer.headers


def test_a_host_a_rule_names_is_intercepted_with_the_sidecars_ca(stack):
    proxies = {"https": stack.proxy_url}
    answer = requests.get(
        "https://api.things.test/repos/acme/app/things",
        proxies=proxies,
        verify=stack.ca_cert,
        timeout=30,
    )
    assert answer.headers["X-Sidecar-Effect"] == "passthrough"
    with pytest.raises(requests.exceptions.SSLError):
        requests.get("https://api.things.test/repos/acme/app/things", proxies=proxies, timeout=30)
