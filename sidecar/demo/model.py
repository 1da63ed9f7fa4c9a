"""A local model endpoint (OpenAI chat completions) that proposes a patch.

Like a real model it is not deterministic: every answer names a fresh branch and adds a
differently worded comment, so an agent that asks again after a crash gets a different
patch - unless the sidecar answers from its cache.

    python -m sidecar.demo.model --listen 127.0.0.1:0     prints "model ready URL"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time

from aiohttp import web

VALIDATION = """
def validate(order):
    if not isinstance(order, dict) or order.get("quantity", 0) <= 0:
        raise ValueError("quantity must be a positive number")
    return order
"""


def propose(task: str, source: str) -> dict[str, object]:
    nonce = secrets.token_hex(3)
    return {
        "branch": f"agent/{task}-{nonce}",
        "title": f"Task {task}: validate order input",
        "body": f"Adds input validation to the orders endpoint (draft {nonce}).",
        "files": {"app.py": source.rstrip("\n") + "\n" + VALIDATION + f"# drafted as {nonce}\n"},
    }


async def completions(request: web.Request) -> web.Response:
    asked = await request.json()
    await asyncio.sleep(request.app[THINKING])
    prompt = json.loads(asked["messages"][-1]["content"])
    plan = propose(str(prompt["task"]), str(prompt["source"]))
    return web.json_response(
        {
            "id": f"chatcmpl-{secrets.token_hex(6)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": asked.get("model", "demo"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": json.dumps(plan)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 50, "completion_tokens": 80, "total_tokens": 130},
        }
    )


THINKING = web.AppKey("thinking", float)


async def serve(host: str, port: int, thinking_s: float = 0.0) -> None:
    app = web.Application()
    app[THINKING] = thinking_s
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    print(f"model ready http://{host}:{runner.addresses[0][1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--thinking-s", type=float, default=0.0, help="delay every answer")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(host or "127.0.0.1", int(port), args.thinking_s))


if __name__ == "__main__":
    main()
