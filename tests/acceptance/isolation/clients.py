"""The isolated agent: one effect per client, each client as it comes, no proxy code.

Prints ``CLIENT STATUS X-Sidecar-Effect`` per client, then what a direct connection to a
port the namespace does not intercept gets. argv: the upstream's port.
"""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import requests

HERE = Path(__file__).parent
URL = "https://api.things.test/repos/iso/lab/things"


def show(name: str, status: object, effect: object) -> None:
    print(name, status, effect, flush=True)


r = requests.post(URL, json={"name": "requests"}, timeout=30)
show("requests", r.status_code, r.headers.get("X-Sidecar-Effect"))
h = httpx.post(URL, json={"name": "httpx"}, timeout=30)
show("httpx", h.status_code, h.headers.get("X-Sidecar-Effect"))


async def with_aiohttp() -> None:
    # aiohttp ignores the proxy variables by default (trust_env=False).
    async with (
        aiohttp.ClientSession() as session,
        session.post(URL, json={"name": "aiohttp"}) as answer,
    ):
        show("aiohttp", answer.status, answer.headers.get("X-Sidecar-Effect"))


asyncio.run(with_aiohttp())


async def plain_http() -> None:
    # Plain HTTP to port 80, proxy variables ignored: redirected like 443.
    async with (
        aiohttp.ClientSession() as session,
        session.post(URL.replace("https:", "http:"), json={"name": "aiohttp-80"}) as answer,
    ):
        show("aiohttp-80", answer.status, answer.headers.get("X-Sidecar-Effect"))


asyncio.run(plain_http())
for kind in ("fetch", "https"):
    subprocess.run(["node", str(HERE / "fetch.mjs"), kind, f"node-{kind}"], check=True)
subprocess.run(["java", str(HERE / "Agent.java"), "java"], check=True)
curl = subprocess.run(
    ["curl", "-sS", "-o", "/dev/null", "-D", "-", "-X", "POST", "-H",
     "content-type: application/json", "-d", '{"name": "curl"}', URL],
    capture_output=True, text=True, check=True,
)  # fmt: skip
head = curl.stdout.strip().split("\n\n")[-1].lower().splitlines()
effect = [line.split(":", 1)[1].strip() for line in head if line.startswith("x-sidecar-effect")]
show("curl", head[0].split()[1], effect[0] if effect else None)

# The namespace has no IPv6 route out: an IPv6 address (HTTPS included) fails at once.
DIRECT = [("api.things.test", 8080), ("127.0.0.1", int(sys.argv[1])), ("2001:db8::1", 443)]
for host, port in DIRECT:
    started = time.monotonic()
    try:
        socket.create_connection((host, port), timeout=10).close()
        outcome = "connected"
    except OSError as error:
        outcome = type(error).__name__
    print("direct", f"{host}:{port}", outcome, f"{time.monotonic() - started:.1f}s", flush=True)
print("proxy-variables", "HTTPS_PROXY" in os.environ, flush=True)
