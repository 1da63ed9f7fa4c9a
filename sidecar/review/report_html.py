"""The figures as one self-contained HTML file: inline CSS, inline SVG charts
(:mod:`.charts`), no script and no address to fetch - it can be mailed or archived and
opened offline.  Every value from the store is escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from sidecar.cli.tables import cell
from sidecar.review import charts
from sidecar.review.figures import Latency, Review
from sidecar.review.report_text import proof_lines

_CSS = """
body { font-family: sans-serif; max-width: 60rem; margin: 2rem auto; color: #222; }
h1 { font-size: 1.5rem; } h2 { font-size: 1.2rem; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ddd; padding: .2rem .5rem; text-align: left; }
.ok { color: #1a7f37; font-weight: bold; } .failed { color: #b00; font-weight: bold; }
.figure { font-size: 1.1rem; } .note { color: #555; font-size: .9rem; }
"""


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(cell(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _p(text: str, cls: str = "figure") -> str:
    return f'<p class="{cls}">{escape(text)}</p>'


def _section(ident: str, title: str, *parts: str) -> str:
    return f'<section id="{ident}"><h2>{escape(title)}</h2>{"".join(parts)}</section>'


def _latency_rows(latencies: list[Latency]) -> list[tuple[object, ...]]:
    return [
        (
            x.what,
            x.samples.count,
            x.samples.p50_ms,
            x.samples.p95_ms,
            x.samples.p99_ms,
            x.samples.max_ms,
            x.how,
        )
        for x in latencies
    ]


def render(review: Review) -> str:
    d, h, u, r, le = (
        review.duplicates,
        review.humans,
        review.uncovered,
        review.refusals,
        review.leases,
    )
    proof = review.fence_proof
    verdict_class = "ok" if proof is not None and proof.ok else "failed"
    lines = proof_lines(proof)
    latencies = [x for x in (review.checkpoint_write, review.effect_write) if x is not None]
    sections = [
        _section(
            "fencing",
            "Fencing proof",
            f'<p class="{verdict_class}">{escape(lines[0])}</p>',
            "<ol>" + "".join(f"<li>{escape(s.strip())}</li>" for s in lines[1:]) + "</ol>",
        ),
        _section(
            "duplicates",
            "Duplicates prevented",
            _table(
                ["replays", "effects replayed", "divergent replays", "divergent rejected"],
                [(d.replays, d.effects_replayed, d.divergent_replays, d.divergent_rejected)],
            ),
            _p(
                "A divergent replay answered from the log a request whose payload differed "
                "from the recorded one; a rejected one was refused (on_divergence: reject).",
                "note",
            ),
        ),
        _section(
            "humans",
            "Effects that waited for a human",
            _table(
                [
                    "waited",
                    "attempts refused while waiting",
                    "waiting now",
                    *(f"settled {k}" for k in h.settled),
                ],
                [(h.waited, h.attempts_blocked, h.waiting_now, *h.settled.values())],
            ),
            _table(
                ["at", "task", "effect", "outcome", "by", "note"],
                [(s.at, s.task, s.key, s.outcome, s.by, s.note) for s in h.settlements],
            ),
        ),
        _section(
            "uncovered",
            "Uncovered writes",
            _p(f"{u.total} writes matched no rule (recorded with --uncovered-writes record)"),
            _table(["write", "count"], [(t.target, t.count) for t in u.targets]),
        ),
        _section(
            "refusals",
            "Refused stale writes",
            _p(f"{r.total} writes refused by fencing"),
            _table(["operation", "refused"], list(r.by_operation.items())),
            _table(
                ["at", "task", "operation", "attempt", "gen", "current gen", "reason"],
                [
                    (
                        x.at,
                        x.task,
                        x.operation,
                        x.attempt_id,
                        x.generation,
                        x.current_generation,
                        x.reason,
                    )
                    for x in r.latest
                ],
            ),
        ),
        _section(
            "leases",
            "Lease duration against stage durations",
            _p(
                f"{le.stages} stages of {le.attempts} attempts, {le.attempts_expired} of which "
                f"let their lease expire; lease (ttl_s) median {cell(le.lease_p50_s)} s; "
                f"{le.near_lease} stages took 80 % of their lease or more, {le.over_lease} "
                "more than all of it."
            ),
            _p(
                "A stage's duration runs from the previous checkpoint of the same attempt "
                "(the first stage: from the claim) to its checkpoint. The lease is the ttl_s "
                "of the task's lease. Stages close to it mean leases are too short, unless "
                "the worker heartbeats during the stage.",
                "note",
            ),
            charts.stages_against_lease(le),
            charts.lease_share(le),
            _table(
                ["stage", "n", "p50 s", "p95 s", "max s", "lease s", "near lease"],
                [
                    (s.stage, s.count, s.p50_s, s.p95_s, s.max_s, s.lease_s, s.near_lease)
                    for s in le.by_stage
                ],
            ),
        ),
        _section(
            "latency",
            "Checkpoint and effect write latency",
            _table(
                ["write", "n", "p50 ms", "p95 ms", "p99 ms", "max ms", "measured"],
                _latency_rows(latencies),
            ),
            charts.write_latency(latencies) if latencies else _p("not measured", "note"),
            _p(
                "These are writes the review made and timed itself on its scratch task. "
                "The time from an effect's pending to its completed line is the upstream's "
                "latency, not the store's, and is not reported as write latency.",
                "note",
            ),
        ),
    ]
    window = review.window
    title = f"sidecar review {cell(window.since)} to {cell(window.until)}"
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{escape(title)}</h1>{_p('source: ' + review.source, 'note')}"
        + "".join(sections)
        + "</body></html>\n"
    )
