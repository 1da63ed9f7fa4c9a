"""``sidecar serve``: open the store, start the control API, run until signalled.

Start-up order matters: the store is open (and migrated) before anything listens, so no
request is ever accepted that could not be recorded.  The chosen addresses are printed
on one line (``effect-sidecar ready control=http://HOST:PORT store=URL``) so that
scripts and tests can use ``:0`` ports.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import dataclass

from aiohttp import web

from sidecar.config import Settings, parse_listen
from sidecar.control import make_app
from sidecar.control.auth import is_loopback
from sidecar.errors import ConfigError
from sidecar.metrics import Metrics
from sidecar.store import Store, create_store
from sidecar.store.observed import MetricsObserver

log = logging.getLogger("sidecar.server")


@dataclass
class Running:
    """A started sidecar: what it listens on and how to stop it."""

    store: Store
    runner: web.AppRunner
    control_url: str

    async def stop(self) -> None:
        await self.runner.cleanup()
        await self.store.close()


async def start(settings: Settings) -> Running:
    host, port = parse_listen(settings.control_listen)
    token = settings.token()
    if not is_loopback(host) and not token:
        raise ConfigError(
            f"the control API would listen on {host}, beyond loopback, without a token: "
            "give --control-token-file FILE (or SIDECAR_CONTROL_TOKEN)"
        )
    store = create_store(settings.store_url)
    await store.open()
    metrics = Metrics()
    store.observer = MetricsObserver(metrics)
    runner = web.AppRunner(make_app(store, metrics=metrics, token=token), access_log=None)
    try:
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        await store.close()
        raise ConfigError(f"cannot listen on {settings.control_listen}: {exc}") from exc
    bound_host, bound_port = runner.addresses[0][:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    return Running(store, runner, f"http://{shown}:{bound_port}")


async def serve(settings: Settings) -> None:
    running = await start(settings)
    info = await running.store.info()
    print(
        f"effect-sidecar ready control={running.control_url} store={info.url}",
        flush=True,
    )
    log.info(
        "sidecar ready",
        extra={
            "control": running.control_url,
            "store": info.backend,
            "schema": info.schema_version,
        },
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("sidecar stopping")
        await running.stop()
        sys.stdout.flush()
