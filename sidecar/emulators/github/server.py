"""Running the GitHub emulator as a process: ``sidecar emulate github``.

The socket is bound before the application is built, so that with port 0 the objects it
answers with already name the port that was picked.  Given a certificate and key it
serves HTTPS, so that a client sent to it under the names the certificate holds (e.g.
api.github.com, with no ``--route`` in between) verifies it as it would GitHub.  Once it
accepts connections it prints one line, ``github emulator ready http(s)://HOST:PORT``,
for scripts and tests, and it runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from sidecar.config import parse_listen
from sidecar.emulators.faults import Late
from sidecar.emulators.github.app import make_app
from sidecar.runtime.aio import stop_on_signals

log = logging.getLogger(__name__)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(
    listen: str,
    data_dir: Path,
    *,
    api_url: str | None = None,
    web_url: str | None = None,
    late: Sequence[Late] = (),
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT; over TLS with ``tls``
    (:func:`sidecar.runtime.tls.server_context`)."""
    host, port = parse_listen(listen)
    sock = _bind(host, port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    address = f"{'https' if tls else 'http'}://{shown}:{bound_port}"
    app = make_app(data_dir, api_url or address, web_url or address, late)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=tls).start()
    print(f"github emulator ready {address}", flush=True)
    stop = asyncio.Event()
    stop_on_signals(stop)
    try:
        await stop.wait()
    finally:
        log.info("github emulator stopping")
        await runner.cleanup()
