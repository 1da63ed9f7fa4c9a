"""A worker that claims a task and writes checkpoints as fast as it can, until killed.

    python -m tests.support.checkpoint_writer --store URL --task T --worker W

Prints ``ready <attempt_id> <generation>`` once it holds the lease, then
``ack <seq> <stage>`` after each checkpoint the store acknowledged (i.e. committed
durably).  A kill test SIGKILLs it at a random moment and then checks that every
acknowledged checkpoint is in the store: the durability promise, tested the hard way.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from itertools import count

from sidecar.store import create_store


async def write_until_killed(url: str, task: str, worker: str, concurrency: int) -> None:
    store = create_store(url)
    await store.open()
    claim = await store.claim(task, worker, ttl_s=60)
    print(f"ready {claim.attempt_id} {claim.generation}", flush=True)
    numbers = count()

    async def writer() -> None:
        while True:
            n = next(numbers)
            stage = f"{claim.attempt_id}/{n}"
            written = await store.append_checkpoint(
                task, claim.attempt_id, claim.generation, stage, {"n": n, "pad": "x" * 200}
            )
            sys.stdout.write(f"ack {written.seq} {written.stage}\n")
            sys.stdout.flush()

    await asyncio.gather(*(writer() for _ in range(concurrency)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--task", default="crash")
    parser.add_argument("--worker", default="crash-writer")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    asyncio.run(write_until_killed(args.store, args.task, args.worker, args.concurrency))


if __name__ == "__main__":
    main()
