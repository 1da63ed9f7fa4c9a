"""``sidecar exec``: run an unmodified agent command as one attempt of a task.

1. ask the running sidecar (control API) for its proxy address and CA bundle;
2. claim the task - a new attempt and generation - waiting for a live lease if asked;
3. start the command with ``HTTP(S)_PROXY=http://TASK:ATTEMPT@proxy`` (the credentials
   tell the proxy which attempt each request acts for) and the combined CA bundle in
   every variable some client reads;
4. heartbeat while it runs; if the lease is lost to another worker, stop the command
   (its writes are refused by the proxy anyway);
5. release the lease when it exits, and exit with its status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import aiohttp

from sidecar.errors import ConfigError, SidecarError, StoreUnavailable
from sidecar.leasekeeper import ControlLeases, Held, LeaseKeeper
from sidecar.trust import TRUST_VARIABLES

log = logging.getLogger("sidecar.exec")

LEASE_LOST_EXIT = 75  # EX_TEMPFAIL: the task goes on elsewhere; this attempt must stop
GRACE_S = 5.0


def agent_environment(
    base: dict[str, str], proxy_url: str, bundle: str, held: Held
) -> dict[str, str]:
    """The child's environment: proxy with credentials, trust bundle, task identity."""
    parts = urlsplit(proxy_url)
    userinfo = f"{quote(held.task, safe='')}:{quote(held.attempt_id, safe='')}"
    with_credentials = urlunsplit((parts.scheme, f"{userinfo}@{parts.netloc}", parts.path, "", ""))
    env = dict(base)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        env[name] = with_credentials
    env.update(dict.fromkeys(TRUST_VARIABLES, bundle))
    # git's default proxy auth method ("anyauth") waits for a 407 challenge before it
    # sends credentials; the proxy never challenges, so have git send them up front.
    env["GIT_HTTP_PROXY_AUTHMETHOD"] = "basic"
    # libpq clients (psql, psycopg, ...) send PGOPTIONS at start-up: the PostgreSQL relay
    # reads the attempt from it (and removes it) as the HTTP proxy reads its credentials.
    binding = f"-c sidecar.task={held.task} -c sidecar.attempt={held.attempt_id}"
    env["PGOPTIONS"] = f"{base['PGOPTIONS']} {binding}" if base.get("PGOPTIONS") else binding
    env.update(
        SIDECAR_TASK=held.task,
        SIDECAR_ATTEMPT_ID=held.attempt_id,
        SIDECAR_GENERATION=str(held.generation),
    )
    return env


async def run(
    command: Sequence[str],
    *,
    control_url: str,
    token: str | None,
    task: str,
    worker: str,
    ttl_s: float,
    wait_s: float,
) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        info = await _proxy_info(session, control_url)
        keeper = LeaseKeeper(ControlLeases(session, control_url), task, worker, ttl_s)
        held = await keeper.acquire(wait_s)
        env = agent_environment(dict(os.environ), info["proxy_url"], info["ca_bundle"], held)
        try:
            child = await asyncio.create_subprocess_exec(*command, env=env)
        except OSError as error:
            await keeper.release()
            raise ConfigError(f"cannot start {command[0]!r}: {error}") from error
        log.info(
            "agent started",
            extra={
                "task": task,
                "attempt_id": held.attempt_id,
                "generation": held.generation,
                "pid": child.pid,
            },
        )
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.add_signal_handler(sig, _forward, child, sig)
        heartbeats = asyncio.create_task(keeper.keep(), name=f"heartbeat:{task}")
        exited = asyncio.create_task(child.wait(), name="agent")
        await asyncio.wait({heartbeats, exited}, return_when=asyncio.FIRST_COMPLETED)
        if not exited.done():
            # The heartbeat loop only ends when the lease was lost to another worker.
            log.error("stopping the agent: its lease was lost", extra={"task": task})
            await _stop(child)
            await exited
        heartbeats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await heartbeats
        await keeper.release()
        if keeper.lost is not None:
            return LEASE_LOST_EXIT
        status = exited.result()
        return 128 - status if status < 0 else status


def _forward(child: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(sig)


async def _stop(child: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        child.terminate()
    try:
        await asyncio.wait_for(child.wait(), GRACE_S)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            child.kill()


async def _proxy_info(session: aiohttp.ClientSession, control_url: str) -> dict[str, Any]:
    url = f"{control_url.rstrip('/')}/v1/proxy"
    try:
        async with session.get(url) as response:
            data: dict[str, Any] = await response.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise StoreUnavailable(
            f"no sidecar answers at {control_url} ({error}); start one with `sidecar serve`"
        ) from error
    if response.status != 200:
        raise SidecarError(f"{url}: {data.get('detail', response.status)}")
    return data
