"""A local upstream that counts what reaches it: the outside world of the proxy tests.

    python -m sidecar.testing.upstream --listen 127.0.0.1:0

prints ``upstream ready http://HOST:PORT`` and serves:

* ``POST /v1/charges`` - creates a charge (201); dedupes on ``Idempotency-Key`` like
  Stripe (same key: the same charge, not a new one);
* ``POST /repos/{owner}/{repo}/things`` - creates a thing ``{name}`` (201; a second one
  with the same name is created too - this API does not dedupe), ``GET`` the same path
  with ``?name=`` lists them (the evidence a probe looks for);
* ``POST /v1/chat/completions`` - a model endpoint whose answer is different every time
  (``"stream": true`` answers Server-Sent Events);
* ``POST /upload`` - reads a body of any size as a stream and answers its length;
* ``GET /slow?delay=S`` / ``POST /slow/things`` - answer after S seconds (default 5);
* ``POST /broken/things`` - creates the thing, then answers 500 (an unknown outcome);
* ``POST /named/things`` - creates the thing and names it in a header as well,
  ``X-Thing-Name`` (UTF-8, as aiohttp writes a header's text);
* ``POST /quiet/things`` - creates the thing and answers ``204 No Content``;
* ``POST /held/things`` - creates the thing, then holds the answer (201) until
  ``POST /_upstream/release``: a test acts while the request is at the upstream;
* ``GET /fast`` and ``POST /effects/{id}`` - minimal answers, for benchmarks;
* ``GET /_upstream/counts`` - how many requests each ``METHOD path`` got, and how many
  charges and things exist: what the tests check afterwards.

It keeps everything in memory; every counter is per process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
from typing import Any

from aiohttp import web

from sidecar.testing.served import serve_main

COUNTS = web.AppKey("counts", dict[str, int])
STATE = web.AppKey("state", dict)
RELEASED = web.AppKey("released", asyncio.Event)


@web.middleware
async def count_requests(request: web.Request, handler: Any) -> web.StreamResponse:
    if not request.path.startswith("/_upstream"):
        seen = request.app[COUNTS]
        name = f"{request.method} {request.path}"
        seen[name] = seen.get(name, 0) + 1
    response: web.StreamResponse = await handler(request)
    return response


def make_app() -> web.Application:
    app = web.Application(middlewares=[count_requests], client_max_size=1 << 30)
    app[COUNTS] = {}
    app[STATE] = {"charges": {}, "by_key": {}, "things": [], "ids": itertools.count(1)}
    app[RELEASED] = asyncio.Event()
    app.add_routes(
        [
            web.post("/v1/charges", create_charge),
            web.post("/repos/{owner}/{repo}/things", create_thing),
            web.get("/repos/{owner}/{repo}/things", list_things),
            web.post("/v1/chat/completions", complete),
            web.post("/upload", upload),
            web.get("/slow", slow),
            web.post("/slow/things", slow_thing),
            web.post("/late/things", late_thing),
            web.post("/broken/things", broken_thing),
            web.post("/named/things", named_thing),
            web.post("/quiet/things", quiet_thing),
            web.post("/held/things", held_thing),
            web.get("/fast", fast),
            web.post("/effects/{id}", effect),
            web.get("/_upstream/counts", counts),
            web.get("/_upstream/things", all_things),
            web.get("/_upstream/charges", all_charges),
            web.post("/_upstream/release", release),
        ]
    )
    return app


async def create_charge(request: web.Request) -> web.Response:
    state = request.app[STATE]
    key = request.headers.get("Idempotency-Key")
    if key and key in state["by_key"]:
        return web.json_response(state["charges"][state["by_key"][key]], status=201)
    body = await request.json()
    charge = {
        "id": f"ch_{next(state['ids'])}",
        "amount": body.get("amount"),
        "order": request.headers.get("X-Order-Id"),
        "idempotency_key": key,
    }
    state["charges"][charge["id"]] = charge
    if key:
        state["by_key"][key] = charge["id"]
    return web.json_response(charge, status=201)


def _new_thing(request: web.Request, body: dict[str, Any]) -> dict[str, Any]:
    state = request.app[STATE]
    thing = {
        "id": next(state["ids"]),
        "name": body.get("name"),
        "repo": f"{request.match_info.get('owner', '-')}/{request.match_info.get('repo', '-')}",
        "authorization": request.headers.get("Authorization"),
        "headers": sorted(name.lower() for name in request.headers),
    }
    state["things"].append(thing)
    return thing


async def create_thing(request: web.Request) -> web.Response:
    return web.json_response(_new_thing(request, await request.json()), status=201)


async def named_thing(request: web.Request) -> web.Response:
    thing = _new_thing(request, await request.json())
    return web.json_response(thing, status=201, headers={"X-Thing-Name": str(thing["name"])})


async def quiet_thing(request: web.Request) -> web.Response:
    """Makes the thing and answers ``204 No Content``, as many APIs answer a PUT."""
    _new_thing(request, await request.json())
    return web.Response(status=204)


async def list_things(request: web.Request) -> web.Response:
    repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
    name = request.query.get("name")
    found = [
        t
        for t in request.app[STATE]["things"]
        if t["repo"] == repo and (name is None or t["name"] == name)
    ]
    return web.json_response(found)


async def all_things(request: web.Request) -> web.Response:
    return web.json_response(request.app[STATE]["things"])


async def all_charges(request: web.Request) -> web.Response:
    return web.json_response(list(request.app[STATE]["charges"].values()))


async def complete(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    words = [secrets.token_hex(3) for _ in range(4)]
    if not body.get("stream"):
        return web.json_response(
            {"id": f"chatcmpl-{secrets.token_hex(4)}", "choices": [{"text": " ".join(words)}]}
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for word in words:
        chunk = {"choices": [{"delta": {"content": word}}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await asyncio.sleep(0.01)
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def upload(request: web.Request) -> web.Response:
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
    return web.json_response({"bytes": size})


async def slow(request: web.Request) -> web.Response:
    await asyncio.sleep(float(request.query.get("delay", "5")))
    return web.json_response({"slow": True})


async def slow_thing(request: web.Request) -> web.Response:
    thing = _new_thing(request, await request.json())
    await asyncio.sleep(float(request.query.get("delay", "5")))
    return web.json_response(thing, status=201)


async def late_thing(request: web.Request) -> web.Response:
    """Works for ``delay`` seconds, then creates the thing: like a server that is still
    busy with a request its client has given up on."""
    body = await request.json()
    await asyncio.sleep(float(request.query.get("delay", "3")))
    return web.json_response(_new_thing(request, body), status=201)


async def broken_thing(request: web.Request) -> web.Response:
    _new_thing(request, await request.json())
    return web.json_response({"message": "internal error"}, status=500)


async def held_thing(request: web.Request) -> web.Response:
    thing = _new_thing(request, await request.json())
    await request.app[RELEASED].wait()
    return web.json_response(thing, status=201)


async def release(request: web.Request) -> web.Response:
    """Answer every held request, now and from now on."""
    request.app[RELEASED].set()
    return web.json_response({"released": True})


async def fast(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def effect(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response({"id": request.match_info["id"]}, status=201)


async def counts(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(
        {
            "requests": request.app[COUNTS],
            "charges": len(state["charges"]),
            "things": len(state["things"]),
        }
    )


def main() -> None:
    serve_main(make_app, "upstream", __doc__)


if __name__ == "__main__":
    main()
