"""Health, readiness, metrics, the OpenAPI document, auth and unknown routes."""

from __future__ import annotations

import asyncio
import io
from unittest import mock

from sidecar.domain.model import EffectState
from sidecar.errors import StoreUnavailable
from sidecar.serve.readiness import Readiness
from sidecar.store.memory import MemoryStore
from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


class UnwritableStore(MemoryStore):
    """A store whose disk is gone: every write and the write probe fail."""

    async def _run(self, command):
        raise StoreUnavailable("disk gone")

    async def check_writable(self) -> None:
        raise StoreUnavailable("disk gone")


async def test_healthz_and_readyz_answer_when_the_store_is_writable(client):
    assert (await (await client.get("/healthz")).json()) == {"status": "ok"}
    ready = await client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["store"]["backend"] == "memory"


async def test_readyz_and_writes_fail_closed_when_the_store_is_unwritable(make_client):
    client = await make_client(store=UnwritableStore())
    await problem_of(await client.get("/readyz"), 503, "store_unavailable")
    response = await client.post("/v1/tasks/312/claim", json={"worker": "a", "ttl_s": 2})
    await problem_of(response, 503, "store_unavailable")
    assert (await client.get("/healthz")).status == 200, "alive even when not ready"


async def test_metrics_count_claims_conflicts_stale_writes_and_checkpoint_latency(client, clock):
    first = await claim(client)
    await client.post("/v1/tasks/312/claim", json={"worker": "worker-b", "ttl_s": 2})
    await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 1, "stage": "A"},
    )
    clock.advance(2)
    await claim(client, worker="worker-b")
    await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 1, "stage": "B"},
    )
    response = await client.get("/metrics")
    assert response.status == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    text = await response.text()
    assert 'sidecar_claims_total{outcome="granted"} 2.0' in text
    assert 'sidecar_claims_total{outcome="lease_held"} 1.0' in text
    assert "sidecar_lease_conflicts_total 1.0" in text
    assert 'sidecar_stale_writes_refused_total{operation="checkpoint"} 1.0' in text
    assert "sidecar_checkpoint_write_seconds_count 1.0" in text
    assert 'sidecar_checkpoint_write_seconds_bucket{le="0.001"}' in text


async def test_openapi_describes_every_route_and_body(client):
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    routes = {
        (method, route.resource.canonical)
        for route in client.app.router.routes()
        if (method := route.method.lower()) != "head"
    }
    documented = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert routes == documented
    schemas = doc["components"]["schemas"]
    claim_op = doc["paths"]["/v1/tasks/{task}/claim"]["post"]
    ref = claim_op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    claim_schema = schemas[ref.rsplit("/", 1)[1]]
    assert claim_schema["additionalProperties"] is False
    assert set(claim_schema["required"]) == {"worker", "ttl_s"}
    assert "409" in claim_op["responses"]
    assert "422" in claim_op["responses"]
    checkpoint_op = doc["paths"]["/v1/tasks/{task}/checkpoints"]["post"]
    assert "201" in checkpoint_op["responses"]


async def test_a_configured_token_is_required_except_for_probes(make_client):
    client = await make_client(token="s3cret")
    response = await client.post("/v1/tasks/312/claim", json={"worker": "a", "ttl_s": 2})
    await problem_of(response, 401, "unauthorized")
    assert response.headers["WWW-Authenticate"] == "Bearer"
    wrong = await client.get("/v1/tasks/312", headers={"Authorization": "Bearer nope"})
    await problem_of(wrong, 401, "unauthorized")
    await problem_of(await client.get("/metrics"), 401, "unauthorized")
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    granted = await client.post(
        "/v1/tasks/312/claim",
        json={"worker": "a", "ttl_s": 2},
        headers={"Authorization": "Bearer s3cret"},
    )
    assert granted.status == 200


async def test_unknown_routes_and_methods_are_problems(client):
    body = await problem_of(await client.get("/v1/nope"), 404, "not_found")
    assert body["instance"] == "/v1/nope"
    response = await client.delete("/v1/tasks/312")
    await problem_of(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "GET,HEAD"
    response = await client.put("/v1/tasks/312/checkpoints", json={})
    await problem_of(response, 405, "method_not_allowed")
    assert response.headers["Allow"] == "GET,HEAD,POST"


async def test_unknown_routes_need_the_token_too(make_client):
    client = await make_client(token="s3cret")
    await problem_of(await client.get("/v1/nope"), 401, "unauthorized")
    signed = {"Authorization": "Bearer s3cret"}
    await problem_of(await client.get("/v1/nope", headers=signed), 404, "not_found")


async def test_a_body_beyond_the_limit_is_a_problem(client):
    too_big = io.BytesIO(b"x" * (1024 * 1024 + 1))
    response = await client.post("/v1/tasks/312/checkpoints", data=too_big)
    await problem_of(response, 413, "payload_too_large")


async def test_an_unexpected_error_is_a_500_problem_that_tells_nothing(client, caplog):
    with mock.patch.object(MemoryStore, "task_view", side_effect=RuntimeError("secret detail")):
        response = await client.get("/v1/tasks/312")
        body = await problem_of(response, 500, "internal")
    assert "secret detail" not in body["detail"]
    assert "unhandled error in GET /v1/tasks/312" in caplog.text


async def test_readyz_waits_for_every_part_of_the_sidecar_and_says_which(make_client):
    readiness = Readiness()
    readiness.require("lease", "the lease of task 312 is not held yet")
    client = await make_client(readiness=readiness)
    response = await client.get("/readyz")
    body = await problem_of(response, 503, "not_ready")
    assert body["pending"] == {"lease": "the lease of task 312 is not held yet"}
    assert response.headers["Retry-After"] == "1"
    readiness.met("lease")
    assert (await client.get("/readyz")).status == 200


async def test_shutdown_asks_the_process_to_stop(make_client):
    asked = asyncio.Event()
    client = await make_client(token="s3cret", shutdown=asked.set)
    response = await client.post("/v1/shutdown", headers={"Authorization": "Bearer s3cret"})
    assert response.status == 202
    assert await response.json() == {"status": "stopping"}
    await asyncio.wait_for(asked.wait(), timeout=5)


async def test_shutdown_needs_the_token_even_from_loopback_when_one_is_configured(make_client):
    # A kubectl port-forward or a mesh proxy delivers outside callers from 127.0.0.1.
    asked = asyncio.Event()
    client = await make_client(token="s3cret", shutdown=asked.set)
    await problem_of(await client.post("/v1/shutdown"), 401, "unauthorized")
    assert not asked.is_set()


async def test_shutdown_is_open_on_loopback_when_no_token_is_configured(make_client):
    asked = asyncio.Event()
    client = await make_client(shutdown=asked.set)
    assert (await client.post("/v1/shutdown")).status == 202
    await asyncio.wait_for(asked.wait(), timeout=5)


async def test_shutdown_without_a_process_to_stop_is_not_found(client):
    await problem_of(await client.post("/v1/shutdown"), 404, "not_found")


def _peer(host: str) -> mock.Mock:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda name, default=None: (
        (host, 40000) if name == "peername" else default
    )
    return transport


async def test_the_bearer_scheme_is_case_insensitive_and_odd_bytes_are_just_wrong(make_client):
    client = await make_client(token="s3cret")
    body = {"worker": "a", "ttl_s": 2}
    lower = await client.post(
        "/v1/tasks/312/claim", json=body, headers={"Authorization": "bearer s3cret"}
    )
    assert lower.status == 200  # RFC 9110: the scheme is case-insensitive
    # Not UTF-8 (once a 500 on every protected route): simply not the token.  Sent raw:
    # a client library would encode the value as UTF-8 itself.
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(
        b"GET /v1/tasks/312 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
        b"Connection: close\r\n\r\n"
    )
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    assert status_line.split()[1] == b"401", status_line


async def test_metrics_read_what_waits_for_a_human_and_the_live_leases(client, memory_store):
    a = await claim(client)
    await claim(client, task="313")
    await memory_store.record_pending(
        "312", "pr#1", a["attempt_id"], 1, kind="http", rule="r", fingerprint="f",
        idempotency_key=None, request={},
    )  # fmt: skip
    await memory_store.transition_effect("312", "pr#1", a["attempt_id"], 1, EffectState.UNKNOWN)
    text = await (await client.get("/metrics")).text()
    assert "sidecar_effects_awaiting_human 1.0" in text
    assert "sidecar_live_leases 2.0" in text
