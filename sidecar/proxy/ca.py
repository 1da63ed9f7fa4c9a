"""The interception CA, and the trust bundle that agents are handed.

The CA is created in ``DATA_DIR/ca`` on first start (mitmproxy's own certificate store,
so mitmproxy signs leaf certificates with it) *before* the proxy listens, so the files a
user is told about exist from the first moment.  Agents need to trust it for intercepted
hosts and to keep trusting the public roots for everything else, and each HTTP client
reads a different variable, hence one combined bundle and many variables.

A CA can also be given (``--ca-from DIR``, e.g. a Kubernetes TLS Secret mounted
read-only, so that every pod of a namespace shares it): ``DIR/tls.crt`` (or ``DIR/ca.crt``
when there is no ``tls.crt``) and ``DIR/tls.key`` are checked - a CA certificate
(basicConstraints CA:TRUE), currently valid, RSA or EC, whose key matches - and copied
into ``DATA_DIR/ca`` in mitmproxy's layout before mitmproxy reads it; a different CA found
there is replaced. ``DIR`` is only ever read.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import certifi
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from mitmproxy import certs

from sidecar.agent.trust import TRUST_VARIABLES
from sidecar.errors import ConfigError

log = logging.getLogger("sidecar.proxy.ca")

CONF_BASENAME = "mitmproxy"  # mitmproxy's tlsconfig addon reads this name from confdir


#: The files read from ``--ca-from DIR`` (the Kubernetes TLS Secret layout).
SOURCE_CERTS = ("tls.crt", "ca.crt")  # the first one present is used
SOURCE_KEY = "tls.key"
#: What mitmproxy derives from a CA it creates; stale once another CA is installed.
_DERIVED = ("ca.p12", "ca-cert.cer", "ca-cert.p12")


@dataclass(frozen=True, slots=True)
class Authority:
    confdir: Path  # mitmproxy's confdir: the CA key and certificate live here
    cert: Path  # the CA certificate alone (PEM)
    bundle: Path  # system roots + the CA (PEM)

    def trust_env(self) -> dict[str, str]:
        return dict.fromkeys(TRUST_VARIABLES, str(self.bundle))


def system_roots() -> str:
    """The host's trusted roots (PEM), falling back to certifi's."""
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and os.path.isfile(candidate):
            return Path(candidate).read_text(encoding="utf-8", errors="replace")
    return Path(certifi.where()).read_text(encoding="utf-8")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"--ca-from: cannot read {path}: {exc.strerror or exc}") from exc


def _fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex(":")


def _load_source(source: Path) -> tuple[bytes, bytes, x509.Certificate]:
    """``(key+chain PEM for mitmproxy, certificate PEM, the CA certificate)`` from ``source``.

    Every error names the file; the key's bytes never appear in a message or a log.
    """
    cert_path = next(
        (source / name for name in SOURCE_CERTS if (source / name).exists()),
        source / SOURCE_CERTS[0],
    )
    key_path = source / SOURCE_KEY
    try:
        chain = x509.load_pem_x509_certificates(_read(cert_path))
    except ValueError as exc:
        raise ConfigError(f"--ca-from: {cert_path} holds no PEM certificate") from exc
    ca = chain[0]
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    except ValueError as exc:
        raise ConfigError(f"--ca-from: {cert_path}: unreadable extensions: {exc}") from exc
    if constraints is None or not constraints.ca:
        raise ConfigError(
            f"--ca-from: {cert_path} is not a CA certificate (basicConstraints CA:TRUE "
            "is required to sign the intercepted hosts' certificates)"
        )
    now = datetime.datetime.now(datetime.UTC)
    if not ca.not_valid_before_utc <= now <= ca.not_valid_after_utc:
        raise ConfigError(
            f"--ca-from: {cert_path} is not valid now (valid from "
            f"{ca.not_valid_before_utc:%Y-%m-%d %H:%M} "
            f"to {ca.not_valid_after_utc:%Y-%m-%d %H:%M} UTC)"
        )
    try:
        key = serialization.load_pem_private_key(_read(key_path), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        # The exception's text is not shown: it is about the key's bytes.
        raise ConfigError(f"--ca-from: {key_path} holds no unencrypted PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
        raise ConfigError(f"--ca-from: {key_path}: only RSA and EC keys are supported")
    if key.public_key() != ca.public_key():
        raise ConfigError(f"--ca-from: {key_path} is not the key of the certificate {cert_path}")
    try:
        ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    except x509.ExtensionNotFound:
        log.warning(
            "%s has no Subject Key Identifier: strict clients (Python 3.13+, "
            "VERIFY_X509_STRICT) reject the certificates it signs",
            cert_path,
        )
    cert_pem = b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in chain)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key_pem + cert_pem, cert_pem, ca


def _write(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    tmp.replace(path)


def install_authority(source: Path, confdir: Path) -> bool:
    """Put the CA of ``source`` in ``confdir`` for mitmproxy; True if anything changed."""
    combined, cert_pem, ca = _load_source(source)
    ca_file = confdir / f"{CONF_BASENAME}-ca.pem"
    cert_file = confdir / f"{CONF_BASENAME}-ca-cert.pem"
    try:
        current = ca_file.read_bytes()
    except FileNotFoundError:
        current = None
    if current == combined and cert_file.exists() and cert_file.read_bytes() == cert_pem:
        log.info("using the CA from %s (sha256 %s)", source, _fingerprint(ca))
        return False
    if current is not None:
        try:
            old = _fingerprint(x509.load_pem_x509_certificates(current)[0])
        except ValueError:
            old = "unreadable"
        log.warning(
            "replacing the CA in %s (sha256 %s) with the one from %s (sha256 %s)",
            confdir,
            old,
            source,
            _fingerprint(ca),
        )
    else:
        log.info("installing the CA from %s (sha256 %s)", source, _fingerprint(ca))
    for suffix in _DERIVED:
        (confdir / f"{CONF_BASENAME}-{suffix}").unlink(missing_ok=True)
    _write(ca_file, combined, 0o600)
    _write(cert_file, cert_pem, 0o644)
    return True


def ensure_authority(
    data_dir: Path, ca_from: Path | None = None, bundle: Path | None = None
) -> Authority:
    """Create (or install, from ``ca_from``) the CA and (re)write the bundle (``bundle``,
    default ``DATA_DIR/ca-bundle.pem``); return paths."""
    confdir = data_dir / "ca"
    confdir.mkdir(parents=True, exist_ok=True)
    os.chmod(confdir, 0o700)  # the CA private key is in here
    if ca_from is not None:
        install_authority(ca_from, confdir)
    if not (confdir / f"{CONF_BASENAME}-ca.pem").exists():
        certs.CertStore.create_store(confdir, CONF_BASENAME, 2048)
    cert = confdir / f"{CONF_BASENAME}-ca-cert.pem"
    bundle = bundle or data_dir / "ca-bundle.pem"
    bundle.parent.mkdir(parents=True, exist_ok=True)
    ours = cert.read_text(encoding="utf-8")
    roots = system_roots()
    tmp = bundle.with_suffix(".tmp")
    tmp.write_text(roots.rstrip("\n") + "\n" + ours, encoding="utf-8")
    tmp.chmod(0o644)  # agents run as other users (another uid in a pod): they must read it
    tmp.replace(bundle)
    return Authority(confdir=confdir, cert=cert, bundle=bundle)
