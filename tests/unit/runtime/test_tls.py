"""Server TLS contexts for the project's own HTTPS servers: a certificate and key that
belong together serve TLS 1.2 and newer; anything else is a clear configuration error."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from sidecar.errors import ConfigError
from sidecar.runtime.tls import server_context
from tests.support import certs


def test_a_certificate_and_its_key_make_a_server_context(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.make_ca()
    cert_file, key_file = certs.write_ca(tmp_path / "server", *certs.issue(ca_cert, ca_key))
    context = server_context(cert_file, key_file)
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert not context.check_hostname  # a server does not check its clients' names


def test_a_missing_or_mismatched_file_is_a_configuration_error(tmp_path: Path) -> None:
    cert_file, _ = certs.write_ca(tmp_path / "one")
    _, other_key = certs.write_ca(tmp_path / "other")
    with pytest.raises(ConfigError, match="cannot load TLS certificate"):
        server_context(cert_file, other_key)
    with pytest.raises(ConfigError, match="cannot load TLS certificate"):
        server_context(tmp_path / "absent.crt", other_key)
