"""TLS server contexts for the HTTPS servers the project runs itself: the admission
webhook (the API server only calls webhooks over HTTPS) and the GitHub emulator (so that
clients verify it as they would GitHub)."""

from __future__ import annotations

import ssl
from pathlib import Path

from sidecar.errors import ConfigError


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context for the PEM certificate chain in ``cert`` (leaf first) and its
    unencrypted private ``key``; unreadable or mismatched files are a :class:`ConfigError`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from exc
    return context
