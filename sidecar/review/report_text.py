"""The figures as text for the terminal: sections of lines and tables that fit
``COLUMNS`` (:mod:`sidecar.cli.tables`); the same figures as ``--json`` and the HTML."""

from __future__ import annotations

from sidecar.cli import tables
from sidecar.review.figures import FenceProof, Latency, Review


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def proof_lines(proof: FenceProof | None) -> list[str]:
    if proof is None:
        return ["fencing proof: not run"]
    verdict = "OK - fencing is active" if proof.ok else "FAILED - FENCING IS NOT ACTIVE"
    return [f"fencing proof: {verdict}", *(f"  {step}" for step in proof.steps)]


def render(review: Review) -> str:
    w, d, h, u, r, le = (
        review.window,
        review.duplicates,
        review.humans,
        review.uncovered,
        review.refusals,
        review.leases,
    )
    out = [
        f"sidecar review of {review.source}",
        f"window: {tables.cell(w.since)} to {tables.cell(w.until)}",
        "",
        *proof_lines(review.fence_proof),
        "",
        "duplicates prevented",
        f"  replays: {d.replays} (of {d.effects_replayed} effects); divergent replays "
        f"(payload differed, answered from the log): {d.divergent_replays}; divergent "
        f"requests rejected: {d.divergent_rejected}",
        "",
        "effects that waited for a human",
        f"  waited: {h.waited}; attempts refused while waiting: {h.attempts_blocked}; "
        f"settled: {_counts(h.settled)}; waiting now: {h.waiting_now}",
    ]
    if h.settlements:
        rows = [(s.at, s.task, s.key, s.outcome, s.by, s.note) for s in h.settlements]
        headers = ["AT", "TASK", "EFFECT", "OUTCOME", "BY", "NOTE"]
        out.append(tables.render(headers, rows, flexible={"TASK", "EFFECT", "NOTE"}))
    out += ["", "uncovered writes (no rule matched)", f"  recorded: {u.total}"]
    if u.targets:
        rows2 = [(t.target, t.count) for t in u.targets]
        out.append(tables.render(["WRITE", "COUNT"], rows2, flexible={"WRITE"}))
    out += [
        "",
        "refused stale writes (fencing)",
        f"  refused: {r.total}; by operation: {_counts(r.by_operation)}",
        "",
        "lease against stage durations",
        f"  {le.stages} stages of {le.attempts} attempts ({le.attempts_expired} let their "
        f"lease expire); lease (ttl_s) median {_s(le.lease_p50_s)} s, shortest "
        f"{_s(le.lease_min_s)} s; stages at 80 % of their lease or more: {le.near_lease}, "
        f"over it: {le.over_lease}",
        "  stage duration: from the previous checkpoint of the same attempt (the first: "
        "from the claim)",
    ]
    if le.by_stage:
        rows3 = [
            (s.stage, s.count, _s(s.p50_s), _s(s.p95_s), _s(s.max_s), _s(s.lease_s), s.near_lease)
            for s in le.by_stage
        ]
        headers = ["STAGE", "N", "P50 S", "P95 S", "MAX S", "LEASE S", "NEAR LEASE"]
        out.append(tables.render(headers, rows3, flexible={"STAGE"}))
    out += ["", "write latency"]
    for latency in (review.checkpoint_write, review.effect_write):
        out += _latency(latency)
    if review.effect_write is None:
        out.append(
            "  effect write: not measured here (no control route writes effects; the "
            "sidecar's sidecar_store_write_seconds in /metrics has them)"
        )
    return "\n".join(out)


def _latency(latency: Latency | None) -> list[str]:
    if latency is None:
        return []
    s = latency.samples
    return [
        f"  {latency.what}: p50 {_ms(s.p50_ms)} ms, p95 {_ms(s.p95_ms)} ms, p99 "
        f"{_ms(s.p99_ms)} ms, max {_ms(s.max_ms)} ms ({s.count} writes)",
        f"    measured: {latency.how}",
    ]


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
