"""TLS is opened only for hosts a rule or a route names; every other tunnel is raw bytes."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from aiohttp import web

from sidecar.testing.served import ThreadedApp
from tests.support.certs import cert_pem, key_pem, make_ca

pytestmark = pytest.mark.acceptance


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = make_ca("pinned upstream", ca=False, key_id=False, ip="127.0.0.1")
    cert_path, key_path = directory / "pinned.pem", directory / "pinned.key"
    cert_path.write_bytes(cert_pem(cert))
    key_path.write_bytes(key_pem(key))
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
