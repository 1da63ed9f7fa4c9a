"""The self-signed webhook's CA and serving certificate: made, judged, and laid out as the
Secret that holds them.

Pure functions of PEM bytes and a time; no I/O. :func:`problem` says why a
:class:`Bundle` (read from the Secret) must be replaced, or ``None`` when it can be
served; :func:`make` makes the replacement, keeping the CA when it is still good, so a
renewal of the serving certificate leaves the ``caBundle`` as it was. The Secret is of
type ``kubernetes.io/tls`` with ``tls.crt``, ``tls.key`` (the serving pair), ``ca.crt``
(what the ``caBundle`` holds) and ``ca.key`` (to sign the next serving certificate).
"""

from __future__ import annotations

import base64
import binascii
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = datetime.timedelta(days=3650)
SERVING_VALIDITY = datetime.timedelta(days=365)
DEFAULT_RENEW_BEFORE = datetime.timedelta(days=30)
# Backdated so that a node whose clock is a little behind the one that signed still
# accepts the certificate; a not-yet-valid certificate is never judged a problem for the
# same reason (replicas with skewed clocks would otherwise replace each other's).
BACKDATE = datetime.timedelta(hours=1)
CA_NAME = "effect-sidecar webhook CA"
KEYS = ("tls.crt", "tls.key", "ca.crt", "ca.key")
# what a CA key read back from the Secret may be (this module makes EC P-256 ones)
SIGNERS = (ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)


class Unusable(ValueError):
    """The Secret's data is not a bundle this module can read."""


@dataclass(frozen=True)
class Bundle:
    """The four PEM documents of the Secret. ``ca_crt`` is the CA that signed ``tls_crt``,
    followed by earlier CAs still valid (kept through a CA rotation, so replicas still
    serving a certificate of the previous CA stay trusted until they pick up the new one).
    """

    tls_crt: bytes
    tls_key: bytes
    ca_crt: bytes
    ca_key: bytes

    @classmethod
    def from_secret_data(cls, data: Mapping[str, object]) -> Bundle:
        """From a Secret's ``data`` (base64 values); :class:`Unusable` if a key is missing."""
        values = []
        for key in KEYS:
            value = data.get(key)
            if not isinstance(value, str):
                raise Unusable(f"no {key}")
            try:
                values.append(base64.b64decode(value, validate=True))
            except binascii.Error as exc:
                raise Unusable(f"{key} is not base64: {exc}") from None
        return cls(*values)

    def secret_data(self) -> dict[str, str]:
        """The Secret's ``data``: each document base64-encoded."""
        documents = (self.tls_crt, self.tls_key, self.ca_crt, self.ca_key)
        return {
            key: base64.b64encode(pem).decode() for key, pem in zip(KEYS, documents, strict=True)
        }

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.tls_crt)

    @property
    def ca_bundle(self) -> str:
        """What the webhook configuration's ``caBundle`` must hold: ``ca.crt``, base64."""
        return base64.b64encode(self.ca_crt).decode()


def dns_names(service: str, namespace: str) -> tuple[str, str]:
    """The names the API server may dial the Service by."""
    return f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"


def problem(
    bundle: Bundle,
    names: Sequence[str],
    now: datetime.datetime,
    renew_before: datetime.timedelta = DEFAULT_RENEW_BEFORE,
) -> str | None:
    """Why ``bundle`` must be replaced (for the log), or ``None`` if it can be served."""
    return _ca_problem(bundle, now) or _serving_problem(bundle, names, now, renew_before)


def make(
    names: Sequence[str],
    now: datetime.datetime,
    previous: Bundle | None = None,
    renew_before: datetime.timedelta = DEFAULT_RENEW_BEFORE,
) -> Bundle:
    """A new serving certificate for ``names``, signed by ``previous``'s CA if that one is
    still good, else by a new CA (the previous one, if still valid, stays in ``ca.crt``)."""
    if previous is not None and _ca_problem(previous, now) is None:
        ca_crt, ca_key_pem = previous.ca_crt, previous.ca_key
    else:
        ca_cert, ca_key = _new_ca(now)
        ca_key_pem = _key_pem(ca_key)
        ca_crt = _pem(ca_cert) + b"".join(
            _pem(old) for old in _earlier_cas(previous, now) if old != ca_cert
        )
    ca_cert = x509.load_pem_x509_certificates(ca_crt)[0]
    signer = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(signer, SIGNERS)  # checked by _ca_problem, or made by _new_ca
    key = ec.generate_private_key(ec.SECP256R1())
    # a serving certificate never outlives the CA that signed it
    not_after = min(now + SERVING_VALIDITY, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(not_after)
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name) for name in names]), critical=False
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    return Bundle(_pem(cert), _key_pem(key), ca_crt, ca_key_pem)


def _ca_problem(bundle: Bundle, now: datetime.datetime) -> str | None:
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
        key = serialization.load_pem_private_key(bundle.ca_key, password=None)
    except (ValueError, TypeError) as exc:
        return f"the CA cannot be read ({exc})"
    if not isinstance(key, SIGNERS) or not _same_key(ca, key):
        return "ca.key is not an EC or RSA key of ca.crt"
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        return "ca.crt is not a CA"
    if not constraints.ca:
        return "ca.crt is not a CA"
    # Replaced a serving lifetime before it ends, so the serving certificate it signs
    # next still gets its full validity.
    if ca.not_valid_after_utc - now < SERVING_VALIDITY:
        return f"the CA expires at {ca.not_valid_after_utc.isoformat()}"
    return None


def _serving_problem(
    bundle: Bundle, names: Sequence[str], now: datetime.datetime, renew_before: datetime.timedelta
) -> str | None:
    try:
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        key = serialization.load_pem_private_key(bundle.tls_key, password=None)
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
    except (ValueError, TypeError) as exc:
        return f"the serving certificate cannot be read ({exc})"
    if not _same_key(cert, key):
        return "tls.key is not the key of tls.crt"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "tls.crt is not signed by the CA in ca.crt"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        covered = set(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        covered = set()
    missing = [name for name in names if name not in covered]
    if missing:
        return f"tls.crt does not cover {', '.join(missing)}"
    if cert.not_valid_after_utc - now <= renew_before:
        return f"tls.crt expires at {cert.not_valid_after_utc.isoformat()}"
    return None


def _earlier_cas(previous: Bundle | None, now: datetime.datetime) -> list[x509.Certificate]:
    """The CAs of ``previous`` still valid now (at most one: the last rotation's)."""
    if previous is None:
        return []
    try:
        cas = x509.load_pem_x509_certificates(previous.ca_crt)
    except ValueError:
        return []
    return [ca for ca in cas if ca.not_valid_after_utc > now][:1]


def _new_ca(now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _same_key(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
