"""The interception CA, and the trust bundle that agents are handed.

The CA is created in ``DATA_DIR/ca`` on first start (mitmproxy's own certificate store,
so mitmproxy signs leaf certificates with it) *before* the proxy listens, so the files a
user is told about exist from the first moment.  Agents need to trust it for intercepted
hosts and to keep trusting the public roots for everything else, and each HTTP client
reads a different variable, hence one combined bundle and many variables.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import certifi
from mitmproxy import certs

CONF_BASENAME = "mitmproxy"  # mitmproxy's tlsconfig addon reads this name from confdir

#: Every variable some client reads for extra CAs (curl, git, Python, Node, pip, AWS).
TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
)


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


def ensure_authority(data_dir: Path) -> Authority:
    """Create the CA if needed and (re)write the combined bundle; return their paths."""
    confdir = data_dir / "ca"
    confdir.mkdir(parents=True, exist_ok=True)
    os.chmod(confdir, 0o700)  # the CA private key is in here
    certs.CertStore.from_store(confdir, CONF_BASENAME, key_size=2048)
    cert = confdir / f"{CONF_BASENAME}-ca-cert.pem"
    bundle = data_dir / "ca-bundle.pem"
    ours = cert.read_text(encoding="utf-8")
    roots = system_roots()
    tmp = bundle.with_suffix(".tmp")
    tmp.write_text(roots.rstrip("\n") + "\n" + ours, encoding="utf-8")
    tmp.replace(bundle)
    return Authority(confdir=confdir, cert=cert, bundle=bundle)
