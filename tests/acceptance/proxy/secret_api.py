"""A stand-in for APIs whose URL or answer holds a secret (the proxy's secret tests).

    python -m tests.acceptance.proxy.secret_api

prints ``secret api ready http://HOST:PORT`` and serves:

* ``POST /bot{token}/sendMessage`` - a Telegram bot message: ``{"ok": true, "result":
  {"message_id": N, "text": ...}}``;
* ``POST /apps`` - registers an OAuth app and answers, gzip-compressed when the client
  accepts it, 201 ``{"client_id", "client_secret", "credentials": {"user",
  "password"}, "name"}`` with a fresh random secret and password each time;
* ``GET /_counts`` - how many requests each ``METHOD path`` got.
"""

from __future__ import annotations

import itertools
import secrets
from typing import Any

from aiohttp import web

from sidecar.testing.served import serve_main

COUNTS = web.AppKey("counts", dict[str, int])
IDS = web.AppKey("ids", itertools.count)


@web.middleware
async def count_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    if request.path != "/_counts":
        seen = request.app[COUNTS]
        name = f"{request.method} {request.path}"
        seen[name] = seen.get(name, 0) + 1
    response: web.StreamResponse = await handler(request)
    return response


async def send_message(request: web.Request) -> web.Response:
    body = await request.json()
    message = {"message_id": next(request.app[IDS]), "text": body.get("text")}
    return web.json_response({"ok": True, "result": message})


async def create_app(request: web.Request) -> web.Response:
    body = await request.json()
    app = {
        "client_id": f"app-{next(request.app[IDS])}",
        "client_secret": f"cs_{secrets.token_hex(16)}",
        "credentials": {"user": "bot", "password": secrets.token_hex(12)},
        "name": body.get("name"),
    }
    response = web.json_response(app, status=201)
    response.enable_compression()  # gzip when the client says it accepts it
    return response


async def counts(request: web.Request) -> web.Response:
    return web.json_response(request.app[COUNTS])


def make_app() -> web.Application:
    app = web.Application(middlewares=[count_requests])
    app[COUNTS] = {}
    app[IDS] = itertools.count(1)
    app.add_routes(
        [
            web.post("/bot{token}/sendMessage", send_message),
            web.post("/apps", create_app),
            web.get("/_counts", counts),
        ]
    )
    return app


def main() -> None:
    serve_main(make_app, "secret api", __doc__)


if __name__ == "__main__":
    main()
