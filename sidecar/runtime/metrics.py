"""Prometheus metrics of one sidecar, on a registry of its own (never the global one)."""

from __future__ import annotations

import threading
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

#: Distinct hosts a host-labelled metric names before the rest are counted as ``other``.
HOST_LABELS = 100
OTHER = "other"


class BoundedLabels:
    """A label whose values come from outside (host names): the first ``cap`` distinct
    values are kept, every later one is ``other``, so an agent calling many hosts cannot
    grow the metrics without bound."""

    def __init__(self, cap: int = HOST_LABELS) -> None:
        self.cap = cap
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.cap:
                self._seen.add(value)
                return value
        return OTHER


class Children[M: (Counter, Histogram)]:
    """A labelled metric's child per label values, made once: ``labels()`` checks its
    values, takes a lock and builds a key on every call (a few microseconds, on every
    effect).  For labels whose values are few (rule names, dispositions, operations)."""

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._made: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child


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
        counter = partial(Counter, registry=self.registry)
        gauge = partial(Gauge, registry=self.registry)
        latency = partial(Histogram, buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.claims = counter(
            "sidecar_claims",
            "Claims by outcome (granted, lease_held, ...).",
            ["outcome"],
        )
        self.lease_conflicts = counter(
            "sidecar_lease_conflicts",
            "Claims refused because another worker's lease was live.",
        )
        self.lease_takeovers = counter(
            "sidecar_lease_takeovers",
            "Claims that ended an attempt which never released its lease (crashed, frozen "
            "or evicted workers).",
        )
        self.stale_writes_refused = counter(
            "sidecar_stale_writes_refused",
            "Writes refused because their generation was not the task's current one.",
            ["operation"],
        )
        self.store_writes = counter(
            "sidecar_store_writes",
            "Store write commands by operation and outcome code.",
            ["operation", "outcome"],
        )
        self.store_write_seconds = latency(
            "sidecar_store_write_seconds",
            "Time from submitting a write to its durable commit.",
            ["operation"],
        )
        self.checkpoint_write_seconds = latency(
            "sidecar_checkpoint_write_seconds",
            "Checkpoint write latency, submit to durable commit (seed: watch the >1 s tail).",
        )
        self.effects = counter(
            "sidecar_effects",
            "Matched requests by rule and what the sidecar did "
            "(recorded, replayed, probed, refused).",
            ["rule", "disposition"],
        )
        self.effects_by = Children(self.effects)
        self.passthrough = counter(
            "sidecar_passthrough_requests",
            "Requests relayed untouched (no rule, or a read/idempotent rule).",
        )
        self.uncovered_writes = counter(
            "sidecar_uncovered_writes",
            "POST/PUT/PATCH/DELETE requests no rule matched, by host (the first 100, then "
            "'other') and method.",
            ["host", "method"],
        )
        self.uncovered_hosts = BoundedLabels()
        self.tunnelled_connections = counter(
            "sidecar_tunnelled_connections",
            "Connections relayed as raw bytes (no rule or route names their host), by the "
            "CONNECT/SNI host (the first 100, then 'other').",
            ["host"],
        )
        self.tunnelled_hosts = BoundedLabels()
        self.refusals = counter(
            "sidecar_refusals",
            "Requests and statements the sidecar refused, by problem code (effect_unknown: "
            "waits for a human; stale_generation, store_unavailable, task_unbound, ...).",
            ["code"],
        )
        self.notifications = counter(
            "sidecar_notifications",
            "Events for --notify by outcome (delivered, failed, dropped).",
            ["event", "outcome"],
        )
        self.effects_awaiting_human = gauge(
            "sidecar_effects_awaiting_human",
            "Effects whose outcome is unknown (read from the store at each scrape).",
        )
        self.live_leases = gauge(
            "sidecar_live_leases",
            "Tasks whose lease is live (read from the store at each scrape).",
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
