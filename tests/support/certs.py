"""Test CAs made with ``cryptography``, written in the Kubernetes TLS Secret layout.

cert, key = write_ca(tmp_path / "ca")          # tmp_path/ca/tls.crt, tls.key
sidecar serve --ca-from tmp_path/ca ...
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

type Key = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


def make_ca(
    name: str = "effect-sidecar test CA",
    *,
    ca: bool = True,
    key: Key | None = None,
    key_id: bool = True,
    ip: str | None = None,
) -> tuple[x509.Certificate, Key]:
    """A self-signed certificate valid for a day; ``ca=False`` makes a leaf instead,
    ``key_id=False`` leaves out the Subject Key Identifier, ``ip`` adds it as a SAN."""
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]),
            critical=False,
        )
    if key_id:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    return builder.sign(key, hashes.SHA256()), key


def write_ca(
    directory: Path,
    cert: x509.Certificate | None = None,
    key: Key | None = None,
    *,
    cert_name: str = "tls.crt",
) -> tuple[Path, Path]:
    """Write ``cert`` and ``key`` (a new CA if not given) as ``tls.crt``/``tls.key``."""
    if cert is None or key is None:
        cert, key = make_ca()
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / cert_name, directory / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def issue(
    ca_cert: x509.Certificate,
    ca_key: Key,
    name: str = "effect-sidecar-webhook",
    *,
    ip: str = "127.0.0.1",
    dns: Sequence[str] = (),
) -> tuple[x509.Certificate, Key]:
    """A serving certificate for ``ip`` and the ``dns`` names, valid for a day, signed by
    the given CA."""
    names: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip))]
    names += [x509.DNSName(host) for host in dns]
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def write_serving_chain(
    folder: Path, name: str, *, dns: Sequence[str] = ()
) -> tuple[Path, Path, Path]:
    """A new test CA and a serving certificate it signed for 127.0.0.1 and ``dns``,
    written under ``folder``: ``(CA certificate file, certificate file, key file)``."""
    ca_cert, ca_key = make_ca()
    ca_file, _ = write_ca(folder / "ca", ca_cert, ca_key)
    cert_file, key_file = write_ca(folder / "server", *issue(ca_cert, ca_key, name, dns=dns))
    return ca_file, cert_file, key_file


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key: Key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
