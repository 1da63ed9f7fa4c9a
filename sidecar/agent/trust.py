"""The environment variables through which clients are told which CAs to trust.

Each client reads a different one (curl, git, Python's ssl and requests, Node, pip, the
AWS SDKs, libpq - whose ``sslmode=verify-full`` then verifies the sidecar's PostgreSQL
relay, which presents a certificate of the sidecar's CA), hence one bundle named by all
of them: ``sidecar exec`` sets them for its
agent and the Kubernetes injector for every app container. A module of its own so that
the injector need not import the proxy (and mitmproxy) to name them.
"""

from __future__ import annotations

TRUST_VARIABLES = (
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "AWS_CA_BUNDLE",
    "PGSSLROOTCERT",
)

#: Set beside the trust variables: libpq's default ``channel_binding=prefer`` makes a SCRAM
#: login over TLS through the relay fail (a binding cannot cross a terminating relay; see
#: docs/postgresql.md), and ``disable`` is what works.  An agent's own URL still wins.
PG_CHANNEL_BINDING = ("PGCHANNELBINDING", "disable")
