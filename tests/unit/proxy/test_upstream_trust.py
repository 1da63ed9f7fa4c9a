"""The CAs the proxy trusts of upstream servers: the system's roots, then --upstream-ca's
certificates; a file that holds none is refused before anything listens."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import config
from sidecar.errors import ConfigError
from sidecar.proxy.ca import system_roots
from sidecar.proxy.upstream_trust import upstream_trust_file
from sidecar.serve import server
from tests.support.certs import write_ca


def test_without_an_upstream_ca_it_is_the_system_roots(tmp_path: Path) -> None:
    written = upstream_trust_file(tmp_path, None)
    assert written == tmp_path / "upstream-roots.pem"
    assert written.read_text() == system_roots().rstrip("\n") + "\n"


def test_an_upstream_ca_comes_after_the_system_roots_not_instead(tmp_path: Path) -> None:
    extra, _ = write_ca(tmp_path / "extra")
    written = upstream_trust_file(tmp_path, extra).read_text()
    assert written.startswith(system_roots().rstrip("\n") + "\n")
    assert written.endswith(extra.read_text())


def test_each_start_writes_it_afresh(tmp_path: Path) -> None:
    extra, _ = write_ca(tmp_path / "extra")
    upstream_trust_file(tmp_path, extra)
    assert extra.read_text() not in upstream_trust_file(tmp_path, None).read_text()


def test_an_upstream_ca_is_copied_byte_for_byte(tmp_path: Path) -> None:
    # Text around the certificates need not be UTF-8 for OpenSSL, so not for the copy.
    extra, _ = write_ca(tmp_path / "extra")
    given = tmp_path / "given.pem"
    given.write_bytes(b"# Zertifikat f\xfcr Tests\n" + extra.read_bytes())
    assert upstream_trust_file(tmp_path, given).read_bytes().endswith(given.read_bytes())


@pytest.mark.parametrize(
    "content",
    [
        None,
        "not a certificate\n",
        "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
    ],
    ids=["missing", "no-pem-block", "garbage-in-a-pem-block"],
)
async def test_start_refuses_an_upstream_ca_with_no_certificate_before_listening(
    tmp_path: Path, content: str | None
) -> None:
    given = tmp_path / "given.pem"
    if content is not None:
        given.write_text(content)
    settings = config.load(
        {
            "control_listen": "127.0.0.1:0",
            "proxy_listen": "127.0.0.1:0",
            "data_dir": tmp_path / "data",
            "upstream_ca": given,
        }
    )
    with pytest.raises(ConfigError, match="--upstream-ca: cannot read CA certificates from"):
        await server.start(settings)
    assert not (tmp_path / "data" / "ca" / "upstream-roots.pem").exists()
