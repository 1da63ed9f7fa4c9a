"""The floor under the sidecar's recorded effects: its engine plus the least SPEC §3 asks.

    .venv/bin/python bench/_floor_proxy.py --db PATH --upstream URL --confdir DIR

mitmproxy embedded the way the sidecar embeds it (``sidecar.proxy.embed``: the same
master, the same few default addons, the same options), with one addon of its own
instead of the sidecar's, which does for ``POST /effects/{id}`` to ``bench.test``
what no design meeting SPEC §3 with these engines can skip, and nothing else:

* an id answered before in this process is answered again from a dict (the replay
  floor: no store read, no write);
* else the effect is written ``pending`` durably, the request goes upstream through an
  aiohttp client (SPEC §3.6: a matched request is never handed back to mitmproxy to
  forward), the answer is written durably, and only then returned.  Both writes are
  sqlite3 in WAL with ``synchronous=FULL``, group-committed in a worker thread
  (``_group_commit.py``); the pending row holds the key and a sha256 of the body (what
  tells a divergent replay), the second the status, headers and body.

Every other request to ``bench.test`` is routed to the upstream and forwarded by
mitmproxy (the pass-through floor), its body and its answer's streamed as the sidecar
streams what it does not record (so the floor's 1 MiB pass-through is the same kind of
base as the sidecar's, not mitmproxy's buffered one).  The garbage collector is set as
the sidecar sets it (``sidecar.runtime.startup``: what the start-up built is frozen,
never scanned again).
No rules, leases, fencing, probes, audit lines, redaction, metrics, logs or control API:
what the sidecar spends beyond this floor is its own.  Not a benchmark itself:
``bench/proxy.py`` runs it next to the sidecar.  Prints ``floor ready http://HOST:PORT``
once listening; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from _group_commit import GroupCommitter, open_db
from mitmproxy import http
from yarl import URL

from sidecar.proxy.embed import EmbeddedProxy
from sidecar.runtime import startup

HOST = "bench.test"
EFFECTS = "/effects/"
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS effects (key TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, "
    "status INTEGER, headers TEXT, body BLOB, created_us INTEGER NOT NULL)"
)
PENDING = "INSERT INTO effects (key, fingerprint, created_us) VALUES (?, ?, ?)"
COMPLETED = "UPDATE effects SET status = ?, headers = ?, body = ? WHERE key = ?"
# What a proxy does not pass on (RFC 9110 §7.6.1), and the client's credentials for it.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authorization", "proxy-connection",
                        "te", "trailer", "transfer-encoding", "upgrade", "host",
                        "content-length"})  # fmt: skip

type Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


class Floor:
    """The addon: effects recorded in ``commits``, sent with ``client`` to ``upstream``."""

    def __init__(
        self, commits: GroupCommitter, client: aiohttp.ClientSession, upstream: URL
    ) -> None:
        self.commits = commits
        self.client = client
        self.upstream = upstream
        self.answers: dict[str, Answer] = {}

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Routes a request to ``bench.test`` that is not an effect to the upstream and
        streams it, as the sidecar routes and streams what no rule records (a streamed
        request goes upstream before the ``request`` hook); an effect's body is
        buffered, to be hashed and recorded."""
        request = flow.request
        if _is_effect(request):
            return
        request.stream = True
        if request.pretty_host == HOST:
            upstream = self.upstream
            request.scheme, request.host, request.port = "http", upstream.host, upstream.port

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        if not _is_effect(flow.request):
            assert flow.response is not None  # mitmproxy calls this hook with its headers
            flow.response.stream = True

    def request(self, flow: http.HTTPFlow) -> Coroutine[Any, Any, None] | None:
        """An effect's work, as a coroutine mitmproxy awaits (a hook that is a coroutine
        function would make one for every flow)."""
        request = flow.request
        if request.pretty_host != HOST or not _is_effect(request):
            return None
        return self.answer(flow, request.path)

    async def answer(self, flow: http.HTTPFlow, key: str) -> None:
        answer = self.answers.get(key)
        if answer is None:
            answer = await self.record(key, flow.request)
        status, body, headers = answer
        flow.response = http.Response.make(status, body, headers)

    async def record(self, key: str, request: http.Request) -> Answer:
        body = request.raw_content or b""
        fingerprint = hashlib.sha256(body).hexdigest()
        await self.commits.write(PENDING, (key, fingerprint, time.time_ns() // 1000))
        headers = [(n, v) for n, v in request.headers.items(True) if n.lower() not in HOP_BY_HOP]
        async with self.client.post(self.upstream.join(URL(key)), data=body, headers=headers) as r:
            kept = [
                (n, v) for n, v in r.raw_headers if n.decode("latin-1").lower() not in HOP_BY_HOP
            ]
            answer: Answer = (r.status, await r.read(), kept)
        stored = json.dumps([[n.decode("latin-1"), v.decode("latin-1")] for n, v in answer[2]])
        await self.commits.write(COMPLETED, (answer[0], stored, answer[1], key))
        self.answers[key] = answer
        return answer


def _is_effect(request: http.Request) -> bool:
    return request.method == "POST" and request.path.startswith(EFFECTS)


def forwarding_client() -> aiohttp.ClientSession:
    """The client effects go upstream with: set as the sidecar's (``proxy/upstream.py``)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=256),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


async def serve(db: Path, upstream: URL, confdir: Path) -> None:
    commits = GroupCommitter(open_db(db, SCHEMA))
    commits.start()
    client = forwarding_client()
    proxy = EmbeddedProxy(
        listen_host="127.0.0.1",
        listen_port=0,
        mode="regular",
        confdir=confdir,
        addons=[Floor(commits, client, upstream)],
        allow_hosts=None,
    )
    ((host, port), *_) = await proxy.start()
    startup.started()  # the garbage collector as the sidecar leaves it (runtime/startup.py)
    print(f"floor ready http://{host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.stop()
        await client.close()
        commits.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--db", type=Path, required=True, help="the SQLite file to write")
    parser.add_argument("--upstream", required=True, help="where bench.test goes: http://H:P")
    parser.add_argument("--confdir", type=Path, required=True, help="mitmproxy's CA directory")
    args = parser.parse_args()
    startup.begin()
    asyncio.run(serve(args.db, URL(args.upstream), args.confdir))


if __name__ == "__main__":
    main()
