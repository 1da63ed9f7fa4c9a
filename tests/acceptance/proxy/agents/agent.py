"""An unmodified "agent": it knows nothing of the sidecar, only its own HTTP client.

    python agent.py CLIENT STEPS_JSON

CLIENT is requests | httpx | aiohttp | curl.  STEPS_JSON is a list of steps, each one of

    {"method": "POST", "url": "https://...", "json": {...}, "headers": {...}}
    {"stream": "https://...", "json": {...}}          (POST, body read as raw bytes)
    {"upload": "https://...", "megabytes": 50}        (POST a streamed body)
    {"sleep": 30}
    {"parallel": [step, step, ...]}                    (threads, same client)

It prints ``pid N`` first, then one JSON line per request: status, the sidecar's headers
and the body (or, for streams, the sha256 of the raw bytes).  The proxy and the CA it
trusts come from the environment, as `sidecar exec` sets them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HEADERS = (
    "x-sidecar-effect",
    "x-sidecar-effect-state",
    "idempotent-replayed",
    "x-sidecar-divergent",
)


def report(status: int, headers: dict[str, str], body: bytes, *, digest: bool = False) -> None:
    lowered = {k.lower(): v for k, v in headers.items()}
    line = {"status": status} | {h: lowered.get(h) for h in HEADERS}
    if digest:
        line["sha256"] = hashlib.sha256(body).hexdigest()
        line["bytes"] = len(body)
    else:
        text = body.decode(errors="replace")
        try:
            line["body"] = json.loads(text)
        except ValueError:
            line["body"] = text
    say(json.dumps(line))


_SAYING = threading.Lock()


def say(text: str) -> None:
    """One whole line: print() writes the text and its newline separately, so lines of
    parallel steps could interleave ("{...}{...}\n\n")."""
    with _SAYING:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def with_requests(step: dict[str, Any]) -> None:
    import requests  # noqa: PLC0415 - each client is imported only when asked for

    if "upload" in step:
        chunk = b"x" * (1 << 20)
        body = (chunk for _ in range(step["megabytes"]))
        r = requests.post(step["upload"], data=body, timeout=120)
    elif "stream" in step:
        r = requests.post(step["stream"], json=step.get("json"), stream=True, timeout=30)
        raw = b"".join(r.raw.stream(1 << 14, decode_content=False))
        report(r.status_code, dict(r.headers), raw, digest=True)
        return
    else:
        r = requests.request(
            step["method"],
            step["url"],
            json=step.get("json"),
            headers=step.get("headers"),
            timeout=30,
        )
    report(r.status_code, dict(r.headers), r.content)


def with_httpx(step: dict[str, Any]) -> None:
    import httpx  # noqa: PLC0415

    with httpx.Client(timeout=30) as client:
        if "stream" in step:
            with client.stream("POST", step["stream"], json=step.get("json")) as r:
                raw = b"".join(r.iter_raw())
                report(r.status_code, dict(r.headers), raw, digest=True)
            return
        r = client.request(
            step["method"], step["url"], json=step.get("json"), headers=step.get("headers")
        )
        report(r.status_code, dict(r.headers), r.content)


def with_aiohttp(step: dict[str, Any]) -> None:
    import aiohttp  # noqa: PLC0415

    async def go() -> None:
        async with (
            aiohttp.ClientSession(trust_env=True) as session,
            session.request(
                step["method"], step["url"], json=step.get("json"), headers=step.get("headers")
            ) as r,
        ):
            report(r.status, dict(r.headers), await r.read())

    asyncio.run(go())


def with_curl(step: dict[str, Any]) -> None:
    args = [
        "curl",
        "-s",
        "--suppress-connect-headers",
        "-D",
        "-",
        "-X",
        step["method"],
        step["url"],
    ]
    for name, value in (step.get("headers") or {}).items():
        args += ["-H", f"{name}: {value}"]
    if "json" in step:
        args += ["-H", "Content-Type: application/json", "--data", json.dumps(step["json"])]
    out = subprocess.run(args, capture_output=True, check=True, timeout=30).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    report(int(lines[0].split()[1]), headers, body)


CLIENTS = {
    "requests": with_requests,
    "httpx": with_httpx,
    "aiohttp": with_aiohttp,
    "curl": with_curl,
}


def run(client: str, step: dict[str, Any]) -> None:
    if "sleep" in step:
        time.sleep(step["sleep"])
    elif "parallel" in step:
        with ThreadPoolExecutor(len(step["parallel"])) as pool:
            list(pool.map(lambda s: run(client, s), step["parallel"]))
    else:
        try:
            CLIENTS[client](step)
        except Exception as error:
            say(json.dumps({"error": f"{type(error).__name__}: {error}"}))


def main() -> None:
    client, steps = sys.argv[1], json.loads(sys.argv[2])
    print(f"pid {os.getpid()}", flush=True)
    for step in steps:
        run(client, step)
    print("done", flush=True)


if __name__ == "__main__":
    main()
