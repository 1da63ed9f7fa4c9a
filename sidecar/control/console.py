"""``GET /ui/``: the operator console, served by the control API's own listener.

The console is a few static files shipped in the package (``sidecar/control/ui/``:
an HTML page, plain ES modules, one stylesheet; no build step, nothing fetched from
elsewhere).  They hold no data, so they are served without the bearer token; every
figure the page shows comes from the JSON routes, which the page calls with the token
the operator typed into it (kept in the browser's session storage, never in a URL).
``GET /`` redirects to ``/ui/``.

The files are read once, on first use, and answered from memory with an ETag; a strict
Content-Security-Policy lets the page load only its own files and talk only to this
origin.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib.resources import files

from aiohttp import web

from sidecar.control.endpoints import Api
from sidecar.errors import NotFound

api = Api("console")

UI_PREFIX = "/ui/"
_ASSET = re.compile(r"^[a-z0-9][a-z0-9_-]*\.(html|js|css|svg)$")
_TYPES = {
    "html": "text/html",
    "js": "text/javascript",
    "css": "text/css",
    "svg": "image/svg+xml",
}
# Inline styles: the review report (SVG charts with style attributes) is shown in a
# sandboxed frame; no inline script anywhere.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; frame-src 'self'; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)


def is_console_path(path: str) -> bool:
    """Paths of the console's static files (and the redirect to them): no data, no token."""
    return path in {"/", UI_PREFIX} or (
        path.startswith(UI_PREFIX) and bool(_ASSET.fullmatch(path[len(UI_PREFIX) :]))
    )


@functools.cache
def _asset(name: str) -> tuple[bytes, str] | None:
    """The file's bytes and ETag, or None when the console ships no such file."""
    if not _ASSET.fullmatch(name):
        return None
    path = files("sidecar.control") / "ui" / name
    if not path.is_file():
        return None
    body = path.read_bytes()
    return body, '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def _answer(request: web.Request, name: str) -> web.Response:
    found = _asset(name)
    if found is None:
        raise NotFound(f"the console has no file {name[:64]!r}")
    body, etag = found
    headers = {
        "ETag": etag,
        # Revalidated on every load (an upgraded sidecar serves new files at once); an
        # unchanged file costs a 304.
        "Cache-Control": "no-cache",
        "Content-Security-Policy": _CSP,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if request.headers.get("If-None-Match") == etag:
        return web.Response(status=304, headers=headers)
    kind = _TYPES[name.rsplit(".", 1)[1]]
    return web.Response(body=body, content_type=kind, charset="utf-8", headers=headers)


@api.route(
    "GET",
    "/",
    summary="Redirects to the operator console (/ui/).",
    status=302,
    content_type="text/plain",
)
async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound(UI_PREFIX)


@api.route(
    "GET",
    "/ui/",
    summary="The operator console: tasks, a task's timeline, what waits for a human, the "
    "review, the rules. Static; its data comes from the JSON routes with the bearer token.",
    content_type="text/html",
    problems=("not_found",),
)
async def console(request: web.Request) -> web.Response:
    return _answer(request, "index.html")


@api.route(
    "GET",
    "/ui/{asset}",
    summary="A static file of the console (script, stylesheet, icon).",
    content_type="text/plain",
    problems=("not_found",),
)
async def console_asset(request: web.Request) -> web.Response:
    return _answer(request, request.match_info["asset"])
