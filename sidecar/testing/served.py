"""aiohttp apps served inside the test process, and stopped without leaking a socket.

    async with serving(app, ssl_context=context) as url:   # on the test's own loop
        ...
    with ThreadedApp(app, ssl_context=context) as url:      # from a thread of its own
        ...

``AppRunner.cleanup()`` asks each open connection to close and returns; a TLS
connection then waits for the peer's close_notify before its socket is closed.  A loop
stopped or closed in that window never closes the socket, and the garbage collector
later reports it as an "unclosed transport" ResourceWarning - in whichever test happens
to be running then.  :func:`stop_runner` therefore aborts every connection the server
still had and lets the loop run the callbacks that close their sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from aiohttp import web

# Loop iterations after an abort: connection_lost (which closes the socket) is scheduled
# with call_soon, and a TLS transport passes the abort through one protocol layer more.
_SETTLE_TICKS = 5


async def stop_runner(runner: web.AppRunner) -> None:
    """Stop accepting, close every connection (aborting what will not close), clean up."""
    for site in list(runner.sites):
        await site.stop()  # no new connection from here on
    server = runner.server
    transports = [
        handler.transport
        for handler in (server.connections if server is not None else [])
        if handler.transport is not None
    ]
    await runner.cleanup()
    for transport in transports:
        transport.abort()  # a no-op for one already closed
    for _ in range(_SETTLE_TICKS):
        await asyncio.sleep(0)


async def start_runner(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, str]:
    """``app`` listening on a free port of 127.0.0.1; returns the runner and its URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context).start()
    host, port = runner.addresses[0][:2]
    scheme = "https" if ssl_context is not None else "http"
    return runner, f"{scheme}://{host}:{port}"


@asynccontextmanager
async def serving(
    app: web.Application, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """``app`` served on the running loop for the block; yields its URL."""
    runner, url = await start_runner(app, ssl_context=ssl_context)
    try:
        yield url
    finally:
        await stop_runner(runner)


class ThreadedApp:
    """``app`` served from a thread and event loop of its own (for synchronous tests and
    fixtures); a context manager whose value is the URL."""

    def __init__(self, app: web.Application, *, ssl_context: ssl.SSLContext | None = None):
        self._app = app
        self._ssl_context = ssl_context
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="served", daemon=True)
        self._runner: web.AppRunner | None = None
        self.url = ""

    def __enter__(self) -> str:
        self._thread.start()
        started = start_runner(self._app, ssl_context=self._ssl_context)
        self._runner, self.url = asyncio.run_coroutine_threadsafe(started, self._loop).result(
            timeout=10
        )
        return self.url

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._runner is not None:
                stopped = asyncio.run_coroutine_threadsafe(stop_runner(self._runner), self._loop)
                stopped.result(timeout=10)
                shut = asyncio.run_coroutine_threadsafe(self._loop.shutdown_asyncgens(), self._loop)
                shut.result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


async def _serve_until_cancelled(app: web.Application, host: str, port: int, name: str) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    bound_host, bound_port = runner.addresses[0][:2]
    print(f"{name} ready http://{bound_host}:{bound_port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def serve_main(make_app: Callable[[], web.Application], name: str, description: str | None) -> None:
    """``python -m MODULE [--listen HOST:PORT]``: serve ``make_app()`` until killed.

    Prints ``NAME ready http://HOST:PORT`` once listening (port 0 picks a free one), the
    line the tests wait for."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--listen", default="127.0.0.1:0")
    host, _, port = parser.parse_args().listen.rpartition(":")
    asyncio.run(_serve_until_cancelled(make_app(), host or "127.0.0.1", int(port), name))
