"""Start-up refuses unsafe settings before opening anything; readiness means every part
is in place; the control API can stop the process."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from sidecar import config
from sidecar.errors import ConfigError
from sidecar.runtime.aio import stop_on_signals
from sidecar.serve import server
from sidecar.store import create_store
from tests.support.imports import loaded_after_importing


async def test_a_control_api_beyond_loopback_needs_a_token(tmp_path):
    settings = config.load({"control_listen": "0.0.0.0:0", "data_dir": tmp_path})
    with pytest.raises(ConfigError, match="without a token"):
        await server.start(settings)
    assert not (tmp_path / "effects.db").exists(), "refused before the store was opened"


async def test_start_opens_the_store_then_listens_on_a_free_port(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret")
    settings = config.load(
        {
            "control_listen": "127.0.0.1:0",
            "proxy_listen": "127.0.0.1:0",
            "data_dir": tmp_path,
            "control_token_file": token,
        }
    )
    running = await server.start(settings)
    try:
        assert running.control_url.startswith("http://127.0.0.1:")
        assert not running.control_url.endswith(":0")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{running.control_url}/readyz") as ready:
                assert ready.status == 200
            async with http.get(f"{running.control_url}/v1/tasks/1") as refused:
                assert refused.status == 401
    finally:
        await running.stop()


async def test_a_port_in_use_is_a_clear_error(tmp_path):
    free = {"control_listen": "127.0.0.1:0", "proxy_listen": "127.0.0.1:0"}
    first = await server.start(config.load(free | {"data_dir": tmp_path}))
    try:
        for name, url in (("control_listen", first.control_url), ("proxy_listen", first.proxy_url)):
            port = url.rsplit(":", 1)[1]
            taken = config.load(free | {name: f"127.0.0.1:{port}", "data_dir": tmp_path / name})
            with pytest.raises(ConfigError, match="cannot listen"):
                await server.start(taken)
    finally:
        await first.stop()


async def test_not_ready_while_another_worker_holds_the_task_then_ready_with_the_lease(tmp_path):
    """An injected agent starts when /readyz passes: that must mean the sidecar holds the
    task's lease, not merely that its control API answers."""
    earlier = create_store(f"sqlite:///{tmp_path / 'effects.db'}")
    await earlier.open()
    try:
        held = await earlier.claim("312", "old-pod", 1.5)
        running = await server.start(task_settings(tmp_path, "new-pod"))
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"{running.control_url}/readyz") as waiting:
                    assert waiting.status == 503
                    problem = await waiting.json(content_type=None)
                assert problem["code"] == "not_ready"
                assert set(problem["pending"]) == {"lease"}
                assert held.generation == 1

                ready = await _poll_ready(http, running.control_url, timeout_s=10)
                assert ready["status"] == "ready"
            view = await running.store.task_view("312")
            assert view is not None
            assert view.state.lease is not None
            assert view.state.lease.worker == "new-pod"
        finally:
            await running.stop()
    finally:
        await earlier.close()


async def test_shutdown_through_the_control_api_ends_serve_and_releases_the_lease(tmp_path):
    running = await server.start(task_settings(tmp_path, "pod-a"))
    try:
        async with aiohttp.ClientSession() as http:
            await _poll_ready(http, running.control_url, timeout_s=10)
            async with http.post(f"{running.control_url}/v1/shutdown") as stopping:
                assert stopping.status == 202
        await asyncio.wait_for(running.stop_requested.wait(), timeout=5)
    finally:
        await running.stop()
    store = create_store(f"sqlite:///{tmp_path / 'effects.db'}")
    await store.open()
    try:
        view = await store.task_view("312")
        assert view is not None
        assert view.state.lease is not None
        assert view.state.lease.released_at is not None, "released on the way out"
    finally:
        await store.close()


def task_settings(data_dir: Path, worker: str) -> config.Settings:
    """A sidecar working on task 312 itself, on free ports."""
    return config.load(
        {
            "control_listen": "127.0.0.1:0",
            "proxy_listen": "127.0.0.1:0",
            "data_dir": data_dir,
            "task": "312",
            "worker": worker,
        }
    )


async def _poll_ready(http: aiohttp.ClientSession, url: str, timeout_s: float) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        async with http.get(f"{url}/readyz") as answer:
            if answer.status == 200:
                return await answer.json()
            body = await answer.json(content_type=None)
        assert loop.time() < deadline, f"not ready after {timeout_s}s: {body}"
        await asyncio.sleep(0.1)


async def test_a_proxy_listening_beyond_loopback_is_warned_about(tmp_path, caplog):
    settings = config.load(
        {"control_listen": "127.0.0.1:0", "proxy_listen": "0.0.0.0:0", "data_dir": tmp_path}
    )
    with caplog.at_level("WARNING", logger="sidecar.serve.server"):
        running = await server.start(settings)
        await running.stop()
    (warning,) = [r for r in caplog.records if "beyond loopback" in r.getMessage()]
    assert "the proxy listens on 0.0.0.0:0" in warning.getMessage()
    assert "--proxy-listen" in warning.getMessage()


async def test_loopback_listeners_start_without_a_warning(tmp_path, caplog):
    settings = config.load(
        {"control_listen": "127.0.0.1:0", "proxy_listen": "127.0.0.1:0", "data_dir": tmp_path}
    )
    with caplog.at_level("WARNING", logger="sidecar.serve.server"):
        running = await server.start(settings)
        await running.stop()
    assert not [r for r in caplog.records if "beyond loopback" in r.getMessage()]


async def test_sigterm_and_sigint_set_the_stop_event():
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        stop = asyncio.Event()
        stop_on_signals(stop)
        try:
            os.kill(os.getpid(), sig)
            await asyncio.wait_for(stop.wait(), 5)
        finally:
            for installed in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(installed)


def test_serving_without_a_task_loads_no_lease_keeper():
    # The keeper is imported only with --task; a plain sidecar should not pay for it.
    assert "sidecar.agent.leasekeeper" not in loaded_after_importing("sidecar.serve.server")
