"""A Java trust store (JKS) holding the certificates of a PEM bundle.

Java ignores certificates of a PKCS12 file that lack Oracle's "trusted key usage"
attribute (the ``cryptography`` package cannot write it: Java then reports "the
trustAnchors parameter must be non-empty"); a JKS file of trusted-certificate entries is
simple to write and every JDK reads it. The file replaces Java's own ``cacerts``, so it
holds the whole bundle (system roots and the sidecar's CA).

Format: magic ``FEEDFEED``, version 2, the entry count, then per entry tag 2 (trusted
certificate), alias, creation time (ms), ``X.509``, the DER; then SHA-1 over the
password (UTF-16BE), ``Mighty Aphrodite`` and everything before.
"""

from __future__ import annotations

import base64
import hashlib
import re
import struct
import time
from pathlib import Path

PASSWORD = "changeit"  # noqa: S105 - Java's customary default; a trust store holds nothing secret

_PEM_CERTIFICATE = re.compile(
    rb"-----BEGIN CERTIFICATE-----(.+?)-----END CERTIFICATE-----", re.DOTALL
)


def _utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def certificates_der(pem_bundle: bytes) -> list[bytes]:
    """The DER of each certificate of a PEM bundle, in order; text around them is skipped.

    A PEM certificate is the base64 of its DER between its two markers, so no X.509
    parser is needed: ``sidecar exec`` writes this store for every agent it runs, and
    importing one (``cryptography``) was about a tenth of exec's import time. Anything
    but base64 and line breaks between the markers is refused (ValueError), as a parser
    would refuse it, instead of being skipped into a certificate Java cannot read."""
    found = [
        base64.b64decode(b"".join(body.split()), validate=True)
        for body in _PEM_CERTIFICATE.findall(pem_bundle)
    ]
    if not found:
        raise ValueError("the bundle holds no PEM certificate")
    return found


def jks_bytes(pem_bundle: bytes, password: str = PASSWORD) -> bytes:
    certificates = certificates_der(pem_bundle)
    now = int(time.time() * 1000)
    body = struct.pack(">III", 0xFEEDFEED, 2, len(certificates))
    for index, der in enumerate(certificates):
        body += struct.pack(">I", 2) + _utf(f"ca{index}") + struct.pack(">Q", now)
        body += _utf("X.509") + struct.pack(">I", len(der)) + der
    digest = hashlib.sha1(  # noqa: S324 - the JKS format's own integrity check
        password.encode("utf-16-be") + b"Mighty Aphrodite" + body
    ).digest()
    return body + digest


def write_trust_store(bundle: Path, target: Path) -> Path:
    target.write_bytes(jks_bytes(bundle.read_bytes()))
    return target
