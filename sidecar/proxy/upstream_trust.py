"""What the proxy trusts of the servers it connects to: the system's roots, and
``--upstream-ca`` on top of them.

Two clients reach upstream servers: the sidecar's own (:mod:`.upstream`, for the effects
it records), which checks them against the system's trusted roots plus
``--upstream-ca``; and mitmproxy, for everything it streams through (reads, calls no rule
records).  Left to itself, mitmproxy trusts certifi's roots, not the system's, and only
``--upstream-ca`` once that is given: a server signed by a company CA in the system store
answered effects but not reads, and with ``--upstream-ca`` every public host's reads
failed.  :func:`upstream_trust_file` writes the one set both must trust, for mitmproxy
(``ssl_verify_upstream_trusted_ca``).
"""

from __future__ import annotations

from pathlib import Path

from sidecar.errors import ConfigError
from sidecar.proxy.ca import system_roots

FILE_NAME = "upstream-roots.pem"


def upstream_trust_file(confdir: Path, extra_ca: Path | None) -> Path:
    """Write ``confdir/upstream-roots.pem``: the system's roots (certifi's where the
    system has none), then ``extra_ca`` byte for byte; return its path.

    ``extra_ca`` is the one the sidecar's own client has loaded already
    (:meth:`.upstream.Upstream.start`), which is where a file that holds no certificate
    is refused; here it is only copied."""
    trusted = system_roots().rstrip("\n").encode() + b"\n"
    if extra_ca is not None:
        try:
            trusted += extra_ca.read_bytes().rstrip(b"\n") + b"\n"
        except OSError as error:
            raise ConfigError(f"--upstream-ca: cannot read {extra_ca}: {error}") from error
    path = confdir / FILE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(trusted)
    tmp.replace(path)
    return path
