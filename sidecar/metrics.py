"""Prometheus metrics of one sidecar, on a registry of its own (never the global one)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.claims = Counter(
            "sidecar_claims",
            "Claims by outcome (granted, lease_held, ...).",
            ["outcome"],
            registry=self.registry,
        )
        self.lease_conflicts = Counter(
            "sidecar_lease_conflicts",
            "Claims refused because another worker's lease was live.",
            registry=self.registry,
        )
        self.stale_writes_refused = Counter(
            "sidecar_stale_writes_refused",
            "Writes refused because their generation was not the task's current one.",
            ["operation"],
            registry=self.registry,
        )
        self.store_writes = Counter(
            "sidecar_store_writes",
            "Store write commands by operation and outcome code.",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.store_write_seconds = Histogram(
            "sidecar_store_write_seconds",
            "Time from submitting a write to its durable commit.",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.checkpoint_write_seconds = Histogram(
            "sidecar_checkpoint_write_seconds",
            "Checkpoint write latency, submit to durable commit (seed: watch the >1 s tail).",
            buckets=_LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.effects = Counter(
            "sidecar_effects",
            "Matched requests by rule and what the sidecar did "
            "(recorded, replayed, probed, refused).",
            ["rule", "disposition"],
            registry=self.registry,
        )
        self.passthrough = Counter(
            "sidecar_passthrough_requests",
            "Requests relayed untouched (no rule, or a read/idempotent rule).",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
