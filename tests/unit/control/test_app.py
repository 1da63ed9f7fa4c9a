"""The control app's router: the agent's hot routes are tried first."""

from __future__ import annotations

from sidecar.control.app import make_app
from sidecar.store.memory import MemoryStore


def test_the_checkpoint_route_is_the_first_tried_under_a_task() -> None:
    # aiohttp tries the resources of a URL prefix one by one, in registration order.
    router = make_app(MemoryStore()).router
    under_tasks = [r.canonical for r in router._resource_index["/v1/tasks"]]
    assert under_tasks[0] == "/v1/tasks/{task}/checkpoints"
    assert under_tasks.index("/v1/tasks/{task}/claim") < under_tasks.index("/v1/tasks/{task}")


async def test_every_task_route_still_resolves_to_its_own_handler(client):
    claimed = await (
        await client.post("/v1/tasks/312/claim", json={"worker": "a", "ttl_s": 5})
    ).json()
    token = {"attempt_id": claimed["attempt_id"], "generation": 1}
    checkpoint = {"stage": "S", "outputs": {}}
    assert (await client.post("/v1/tasks/312/checkpoints", json=token | checkpoint)).status == 201
    assert (await client.post("/v1/tasks/312/heartbeat", json=token)).status == 200
    assert (await client.get("/v1/tasks/312/checkpoints")).status == 200
    assert (await client.get("/v1/tasks/312/effects")).status == 200
    assert (await client.get("/v1/tasks/312")).status == 200
    assert (await client.get("/v1/tasks")).status == 200
    assert (await client.post("/v1/tasks/312/release", json=token)).status == 200
