"""TLS for the agent's leg of the PostgreSQL relay: certificates from the sidecar's own CA.

An agent that sends SSLRequest gets ``S`` and a TLS handshake in which the relay presents
a certificate for the name the agent asked for - the SNI of its ClientHello (libpq sends
it by default, ``sslsni=1``) - issued on the spot by the sidecar's CA (the interception
CA in ``DATA_DIR/ca``, the one the trust bundle carries), so ``sslmode=verify-full`` with
``PGSSLROOTCERT`` naming the bundle verifies it like any server.  A name is a DNS SAN; an
address (a client connecting by IP sends no SNI, as RFC 6066 says) is an IP SAN, and a
ClientHello without SNI gets the address the agent connected to (the listen address, or
in transparent mode the address it meant to reach).

Leaves are EC P-256 keys that only ever live in memory (loaded into OpenSSL through an
anonymous memory file), one per name, kept in a bounded LRU cache: a client making up a
new name per connection costs a signature each time, never unbounded memory.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
import ssl
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from sidecar.errors import ConfigError

log = logging.getLogger("sidecar.pgwire")

#: How many leaves (one per name) are kept; the least recently used goes first.
CACHE_SIZE = 256
#: A leaf's life; re-issued a day before it ends (and never outliving the CA).
LEAF_DAYS = 90
_RENEW = datetime.timedelta(days=1)
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
ALPN = ["postgresql"]  # what PostgreSQL 17 servers and libpq announce


class LeafContext(ssl.SSLContext):
    """A server context presenting the leaf for one name (``name``)."""

    name: str = ""


def host_name(name: str) -> str | None:
    """``name`` as a certificate can hold it: an address in canonical form, a DNS name in
    lower case; None when it is neither (garbage in an SNI)."""
    name = name.strip().rstrip(".")
    if "%" in name:  # an IPv6 scope (fe80::1%eth0) is no part of the address
        name = name.split("%", 1)[0]
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        pass
    if not name or len(name) > 253:
        return None
    labels = name.lower().split(".")
    wildcard = labels[0] == "*" and len(labels) > 1
    if all(_LABEL.fullmatch(label) for label in labels[1 if wildcard else 0 :]):
        return name.lower()
    return None


class RelayCertificates:
    """Issues and caches the relay's leaves; :meth:`context_for` gives the context a
    connection starts its handshake with."""

    def __init__(
        self,
        ca_cert: x509.Certificate,
        ca_key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey,
        chain_pem: bytes,
        *,
        cache_size: int = CACHE_SIZE,
    ) -> None:
        self._ca_cert = ca_cert
        self._ca_key = ca_key
        self._chain_pem = chain_pem  # the CA (and what signed it), sent after the leaf
        self._cache: OrderedDict[str, tuple[LeafContext, datetime.datetime]] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.issued = 0  # leaves minted so far (a cache miss each)

    @classmethod
    def from_confdir(
        cls, confdir: Path, cert: Path, *, cache_size: int = CACHE_SIZE
    ) -> RelayCertificates:
        """The CA kept in ``confdir`` (mitmproxy's ``mitmproxy-ca.pem``: key and
        certificate) and ``cert`` (its certificate chain, PEM)."""
        combined = confdir / "mitmproxy-ca.pem"
        try:
            key = serialization.load_pem_private_key(combined.read_bytes(), password=None)
            chain_pem = cert.read_bytes()
            chain = x509.load_pem_x509_certificates(chain_pem)
        except (OSError, ValueError, TypeError) as error:
            # Not the key's bytes: the class of the problem only.
            raise ConfigError(
                f"the PostgreSQL relay cannot read the CA in {confdir}: {type(error).__name__}"
            ) from None
        if not isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey):
            raise ConfigError(f"the CA key in {combined} is neither RSA nor EC")
        return cls(chain[0], key, chain_pem, cache_size=cache_size)

    def context_for(self, name: str) -> LeafContext:
        """The server context for ``name`` (minted on first use, then cached)."""
        now = datetime.datetime.now(datetime.UTC)
        with self._lock:
            found = self._cache.get(name)
            if found is not None and now < found[1] - _RENEW:
                self._cache.move_to_end(name)
                return found[0]
        context, not_after = self._mint(name, now)
        with self._lock:
            self._cache[name] = (context, not_after)
            self._cache.move_to_end(name)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return context

    def cached(self) -> list[str]:
        """The names with a leaf in the cache, least recently used first."""
        with self._lock:
            return list(self._cache)

    def _sni(self, ssl_object: ssl.SSLObject | ssl.SSLSocket, server_name: str | None,
             current: ssl.SSLContext) -> None:  # fmt: skip
        """OpenSSL's servername callback: present the leaf for the name the agent asked
        for.  No SNI, or one no certificate can hold, keeps the connection's default."""
        if server_name is None:
            return
        name = host_name(server_name)
        if name is None or (isinstance(current, LeafContext) and current.name == name):
            return
        try:
            ssl_object.context = self.context_for(name)
        except Exception:  # an exception here would only surface as a handshake alert
            log.exception("cannot issue a certificate for %r", name)

    def _mint(self, name: str, now: datetime.datetime) -> tuple[LeafContext, datetime.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        ca = self._ca_cert
        not_after = min(now + datetime.timedelta(days=LEAF_DAYS), ca.not_valid_after_utc)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            san = x509.DNSName(name)
        subject = x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, name)] if len(name) <= 64 else []
        )
        try:
            authority = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            )
        except x509.ExtensionNotFound:
            authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self._ca_key.public_key()
            )
        usage = x509.KeyUsage(
            digital_signature=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=False,
            crl_sign=False, encipher_only=False, decipher_only=False,
        )  # fmt: skip
        public = key.public_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca.subject)
            .public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # a little clock skew
            .not_valid_after(not_after)
        )
        for extension, critical in (
            (x509.SubjectAlternativeName([san]), False),
            (x509.BasicConstraints(ca=False, path_length=None), True),
            (usage, True),
            (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            (x509.SubjectKeyIdentifier.from_public_key(public), False),
            (authority, False),
        ):
            builder = builder.add_extension(extension, critical=critical)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        context = LeafContext(ssl.PROTOCOL_TLS_SERVER)
        context.name = name
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(ALPN)
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _load_in_memory(
            context, cert.public_bytes(serialization.Encoding.PEM) + self._chain_pem, key_pem
        )
        context.sni_callback = self._sni
        self.issued += 1
        log.debug("issued a certificate for %s, valid until %s", name, not_after)
        return context, not_after


def _load_in_memory(context: ssl.SSLContext, chain: bytes, key: bytes) -> None:
    """``load_cert_chain`` reads files only: give it an anonymous memory file (Linux), so
    the key never reaches a disk; elsewhere a private file removed at once."""
    data = chain + key
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("sidecar-pg-leaf", os.MFD_CLOEXEC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            context.load_cert_chain(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="sidecar-pg-") as private:  # 0700
        path = Path(private) / "leaf.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        try:
            context.load_cert_chain(path)
        finally:
            path.unlink(missing_ok=True)
