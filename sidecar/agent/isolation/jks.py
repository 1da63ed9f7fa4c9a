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

import hashlib
import struct
import time
import warnings
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

PASSWORD = "changeit"  # noqa: S105 - Java's customary default; a trust store holds nothing secret


def _utf(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">H", len(data)) + data


def jks_bytes(pem_bundle: bytes, password: str = PASSWORD) -> bytes:
    with warnings.catch_warnings():  # old system roots with non-positive serials
        warnings.simplefilter("ignore")
        certificates = x509.load_pem_x509_certificates(pem_bundle)
    now = int(time.time() * 1000)
    body = struct.pack(">III", 0xFEEDFEED, 2, len(certificates))
    for index, certificate in enumerate(certificates):
        der = certificate.public_bytes(Encoding.DER)
        body += struct.pack(">I", 2) + _utf(f"ca{index}") + struct.pack(">Q", now)
        body += _utf("X.509") + struct.pack(">I", len(der)) + der
    digest = hashlib.sha1(  # noqa: S324 - the JKS format's own integrity check
        password.encode("utf-16-be") + b"Mighty Aphrodite" + body
    ).digest()
    return body + digest


def write_trust_store(bundle: Path, target: Path) -> Path:
    target.write_bytes(jks_bytes(bundle.read_bytes()))
    return target
