"""git smart HTTP for the GitHub emulator: git's own ``git http-backend``, run as a CGI.

Clone, fetch and push go through the same program a real git server runs, so the wire
protocol (v0 and v2, side-band progress, non-fast-forward refusals by the client) is
git's, not an imitation.  The request body is streamed into the CGI and its answer
streamed back, so packs of any size pass without being held in memory.

Like GitHub, both ``/{owner}/{repo}.git/...`` and ``/{owner}/{repo}/...`` work.  Unlike
GitHub, no credentials are asked for: the emulator stands in for an account that may
push anywhere, and an agent that sends a token in its remote URL is accepted as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from aiohttp import web

from sidecar.emulators.github.api import state_of, unauthenticated
from sidecar.emulators.github.state import AUTHENTICATED_USER

log = logging.getLogger(__name__)
routes = web.RouteTableDef()

CHUNK = 1 << 16
# Headers the CGI answers that aiohttp must compute itself for the streamed response.
HOP_BY_HOP = frozenset({"status", "content-length", "transfer-encoding", "connection"})


@routes.get("/{owner}/{repo}/info/refs")
@unauthenticated
async def info_refs(request: web.Request) -> web.StreamResponse:
    return await _backend(request, "info/refs")


@routes.post("/{owner}/{repo}/git-upload-pack")
@unauthenticated
async def upload_pack(request: web.Request) -> web.StreamResponse:
    return await _backend(request, "git-upload-pack")


@routes.post("/{owner}/{repo}/git-receive-pack")
@unauthenticated
async def receive_pack(request: web.Request) -> web.StreamResponse:
    return await _backend(request, "git-receive-pack")


def _cgi_env(request: web.Request, path_info: str) -> dict[str, str]:
    state = state_of(request)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/"),
        "GIT_PROJECT_ROOT": str(state.repos_dir),
        "GIT_HTTP_EXPORT_ALL": "1",
        # http-backend serves receive-pack only to an authenticated user.
        "REMOTE_USER": AUTHENTICATED_USER,
        "REMOTE_ADDR": request.remote or "127.0.0.1",
        "GATEWAY_INTERFACE": "CGI/1.1",
        "SERVER_PROTOCOL": f"HTTP/{request.version.major}.{request.version.minor}",
        "REQUEST_METHOD": request.method,
        "PATH_INFO": path_info,
        "QUERY_STRING": request.query_string,
        "CONTENT_TYPE": request.headers.get("Content-Type", ""),
    }
    if protocol := request.headers.get("Git-Protocol"):
        env["HTTP_GIT_PROTOCOL"] = protocol  # lets clients speak protocol v2
    # aiohttp already inflates a gzip-encoded body (git sends large fetch negotiations
    # that way), so the CGI gets it plain: no Content-Encoding, and the length of the
    # body as sent no longer applies - http-backend then reads to end of input.
    if request.headers.get("Content-Encoding"):
        return env
    if (length := request.headers.get("Content-Length")) is not None:
        env["CONTENT_LENGTH"] = length
    return env


async def _backend(request: web.Request, tail: str) -> web.StreamResponse:
    name = request.match_info["repo"].removesuffix(".git")
    repo = state_of(request).repo(request.match_info["owner"], name)
    if repo is None:
        return web.Response(status=404, text="Repository not found.\n")
    env = _cgi_env(request, f"/{repo.owner}/{repo.name}.git/{tail}")
    proc = await asyncio.create_subprocess_exec(
        "git",
        "http-backend",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    feeding = asyncio.ensure_future(_feed(request, proc.stdin))
    errors = asyncio.ensure_future(proc.stderr.read())
    try:
        status, headers = await _read_cgi_headers(proc.stdout)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        while chunk := await proc.stdout.read(CHUNK):
            await response.write(chunk)
        await response.write_eof()
        await feeding
        return response
    finally:
        feeding.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await proc.wait()
        stderr = (await errors).decode(errors="replace").strip()
        # Progress chatter on success is noise; a failing backend's words are the clue.
        level = logging.DEBUG if proc.returncode == 0 else logging.WARNING
        if stderr or proc.returncode:
            log.log(level, "git http-backend %s exited %s: %s", tail, proc.returncode, stderr)


async def _feed(request: web.Request, stdin: asyncio.StreamWriter) -> None:
    """Stream the request body into the CGI, then close its input."""
    try:
        async for chunk in request.content.iter_chunked(CHUNK):
            stdin.write(chunk)
            await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        pass  # the backend answered without reading everything (e.g. a 403); fine
    finally:
        stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await stdin.wait_closed()


async def _read_cgi_headers(stdout: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """The CGI header block: ``Status:`` (default 200) and the headers to pass on."""
    status, headers = 200, {}
    while line := (await stdout.readline()).rstrip(b"\r\n"):
        key, _, value = line.decode("latin-1").partition(":")
        key, value = key.strip(), value.strip()
        if key.lower() == "status":
            status = int(value.split()[0])
        elif key.lower() not in HOP_BY_HOP:
            headers[key] = value
    return status, headers
