"""Start-up refuses unsafe settings before opening anything."""

from __future__ import annotations

import aiohttp
import pytest

from sidecar import config, server
from sidecar.errors import ConfigError


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
