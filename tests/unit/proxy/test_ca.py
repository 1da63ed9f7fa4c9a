"""``--ca-from DIR``: a CA given in the Kubernetes TLS Secret layout is checked and installed
where mitmproxy reads its CA, and the trust bundle carries it; DIR is only read."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mitmproxy import certs

from sidecar import config
from sidecar.errors import ConfigError
from sidecar.proxy.ca import CONF_BASENAME, ensure_authority, install_authority
from sidecar.serve import server
from tests.support.certs import make_ca, write_ca


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def snapshot(directory: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        path.name: (path.read_bytes(), path.stat().st_mtime_ns, path.stat().st_mode)
        for path in sorted(directory.iterdir())
    }


@pytest.fixture
def source(tmp_path: Path) -> Path:
    directory = tmp_path / "secret"
    write_ca(directory)
    return directory


def read_only(directory: Path) -> None:
    for path in directory.iterdir():
        path.chmod(0o444)
    directory.chmod(0o555)


def test_the_ca_is_installed_for_mitmproxy_and_in_the_bundle(tmp_path, source):
    read_only(source)
    before = snapshot(source)
    authority = ensure_authority(tmp_path / "data", source)
    ours = x509.load_pem_x509_certificate((source / "tls.crt").read_bytes())
    assert authority.cert.read_bytes() == pem(ours)
    assert (authority.confdir / f"{CONF_BASENAME}-ca.pem").stat().st_mode & 0o777 == 0o600
    assert authority.confdir.stat().st_mode & 0o777 == 0o700
    store = certs.CertStore.from_store(authority.confdir, CONF_BASENAME, key_size=2048)
    assert store.default_ca.to_cryptography() == ours
    leaf = store.get_cert("api.example.test", [], None).cert.to_cryptography()
    leaf.verify_directly_issued_by(ours)
    bundle = authority.bundle.read_bytes()
    assert pem(ours) in bundle
    assert bundle.count(b"BEGIN CERTIFICATE") > 1, "the system roots are still there"
    assert snapshot(source) == before, "the source directory is only read"


def test_a_second_start_with_the_same_ca_changes_nothing(tmp_path, source):
    data = tmp_path / "data"
    ensure_authority(data, source)
    certs.CertStore.from_store(data / "ca", CONF_BASENAME, key_size=2048)
    before = snapshot(data / "ca")
    assert install_authority(source, data / "ca") is False
    ensure_authority(data, source)
    assert snapshot(data / "ca") == before


def test_a_different_ca_replaces_the_one_there_and_says_so(tmp_path, source, caplog):
    data = tmp_path / "data"
    created = ensure_authority(data)  # mitmproxy's own CA, with its .p12 and .cer copies
    assert (data / "ca" / f"{CONF_BASENAME}-ca-cert.p12").exists()
    old = created.cert.read_bytes()
    with caplog.at_level(logging.INFO, logger="sidecar.proxy.ca"):
        authority = ensure_authority(data, source)
    assert authority.cert.read_bytes() == (source / "tls.crt").read_bytes()
    assert authority.cert.read_bytes() != old
    assert old not in authority.bundle.read_bytes()
    assert "replacing the CA" in caplog.text
    for stale in ("ca.p12", "ca-cert.p12", "ca-cert.cer"):
        assert not (data / "ca" / f"{CONF_BASENAME}-{stale}").exists()
    other = tmp_path / "other"
    write_ca(other, *make_ca("another CA"))
    ensure_authority(data, other)
    assert authority.cert.read_bytes() == (other / "tls.crt").read_bytes()
    assert "PRIVATE KEY" not in caplog.text


def test_ca_crt_is_read_when_there_is_no_tls_crt(tmp_path):
    directory = tmp_path / "secret"
    cert_path, _ = write_ca(directory, cert_name="ca.crt")
    authority = ensure_authority(tmp_path / "data", directory)
    assert authority.cert.read_bytes() == cert_path.read_bytes()


def test_an_rsa_ca_works_too(tmp_path):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    directory = tmp_path / "secret"
    write_ca(directory, *make_ca(key=key))
    authority = ensure_authority(tmp_path / "data", directory)
    store = certs.CertStore.from_store(authority.confdir, CONF_BASENAME, key_size=2048)
    assert store.default_ca.to_cryptography().public_key() == key.public_key()


def _not_a_ca(directory: Path) -> str:
    write_ca(directory, *make_ca("a leaf", ca=False))
    return "tls.crt"


def _mismatched_key(directory: Path) -> str:
    cert, _ = make_ca()
    write_ca(directory, cert, ec.generate_private_key(ec.SECP256R1()))
    return "tls.key"


def _no_key(directory: Path) -> str:
    write_ca(directory)
    (directory / "tls.key").unlink()
    return "tls.key"


def _no_cert(directory: Path) -> str:
    write_ca(directory)
    (directory / "tls.crt").unlink()
    return "tls.crt"


def _garbage_key(directory: Path) -> str:
    write_ca(directory)
    (directory / "tls.key").write_text(
        "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n"
    )
    return "tls.key"


def _encrypted_key(directory: Path) -> str:
    cert, key = make_ca()
    write_ca(directory, cert, key)
    (directory / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"pass"),
        )
    )
    return "tls.key"


def _garbage_cert(directory: Path) -> str:
    write_ca(directory)
    (directory / "tls.crt").write_text("not a certificate\n")
    return "tls.crt"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (_not_a_ca, "is not a CA certificate"),
        (_mismatched_key, "is not the key of the certificate"),
        (_no_key, "cannot read"),
        (_no_cert, "cannot read"),
        (_garbage_key, "no unencrypted PEM private key"),
        (_encrypted_key, "no unencrypted PEM private key"),
        (_garbage_cert, "holds no PEM certificate"),
    ],
)
def test_a_bad_source_is_a_config_error_naming_the_file(tmp_path, make, message, caplog):
    directory = tmp_path / "secret"
    name = make(directory)
    read_only(directory)
    before = snapshot(directory)
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigError) as caught:
        ensure_authority(tmp_path / "data", directory)
    assert str(directory / name) in caught.value.detail
    assert message in caught.value.detail
    assert "c2VjcmV0" not in caught.value.detail + caplog.text
    assert not (tmp_path / "data" / "ca" / f"{CONF_BASENAME}-ca.pem").exists()
    assert snapshot(directory) == before


def test_a_bad_source_leaves_the_ca_there_as_it_was(tmp_path, source):
    data = tmp_path / "data"
    ensure_authority(data, source)
    before = snapshot(data / "ca")
    bad = tmp_path / "bad"
    _mismatched_key(bad)
    with pytest.raises(ConfigError):
        ensure_authority(data, bad)
    assert snapshot(data / "ca") == before


def test_ca_from_comes_from_the_flag_the_environment_or_the_file(tmp_path, monkeypatch):
    assert config.load({}).ca_from is None
    monkeypatch.setenv("SIDECAR_CA_FROM", "/etc/effect-sidecar/ca")
    assert config.load({}).ca_from == Path("/etc/effect-sidecar/ca")
    assert config.load({"ca_from": tmp_path}).ca_from == tmp_path


async def test_start_refuses_a_bad_ca_before_listening(tmp_path):
    directory = tmp_path / "secret"
    _not_a_ca(directory)
    settings = config.load(
        {
            "control_listen": "127.0.0.1:0",
            "proxy_listen": "127.0.0.1:0",
            "data_dir": tmp_path / "data",
            "ca_from": directory,
        }
    )
    with pytest.raises(ConfigError, match=r"tls\.crt is not a CA certificate"):
        await server.start(settings)


def test_the_key_file_is_never_world_readable(tmp_path, source):
    authority = ensure_authority(tmp_path / "data", source)
    mode = os.stat(authority.confdir / f"{CONF_BASENAME}-ca.pem").st_mode
    assert mode & 0o077 == 0


def test_a_ca_without_a_subject_key_identifier_is_used_with_a_warning(tmp_path, caplog):
    directory = tmp_path / "secret"
    write_ca(directory, *make_ca(key_id=False))
    with caplog.at_level(logging.WARNING, logger="sidecar.proxy.ca"):
        ensure_authority(tmp_path / "data", directory)
    assert "has no Subject Key Identifier" in caplog.text
