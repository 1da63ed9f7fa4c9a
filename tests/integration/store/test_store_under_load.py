"""Workers racing for few tasks on one real store, in one process and as two nodes.

8 workers over 4 tasks with 0.2 s leases for a few seconds (tests/support/store_race.py:
leases released early and late, walked away from, and kept by zombies that go on
writing with their stale token), then every grant and every stored row is checked: no
two live leases on one task, no stale write accepted, every deliberately stale write
refused, and the store's rows and fence log exactly the writes and refusals the workers
saw.  ``bench/stores.py`` runs the same workload for its figures.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from tests.conftest import drop_schema, scratch_schema
from tests.support.store_race import Phase, Tally, Verdict, check, run_phase, wall_us

SECONDS = 2.0


@pytest.fixture(params=["sqlite", "postgresql"])
def race_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/effects.db"
        return
    server = request.getfixturevalue("postgres_server")
    schema = scratch_schema()
    yield f"{server}?schema={schema}"
    drop_schema(server, schema)


def phase_for(url: str, *, procs: int = 1, workers: int = 8, seconds: float = SECONDS) -> Phase:
    return Phase(
        backend=url.partition(":")[0],
        url=url,
        workers=workers,
        procs=procs,
        tasks=[f"t{i}" for i in range(4)],
        ttl=0.2,
        seconds=seconds,
        seed=312,
    )


def totals(tallies: list[Tally]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for tally in tallies:
        counts.update(tally.counts)
    return counts


def findings(verdict: Verdict) -> tuple[int, int, int]:
    return verdict.double_ownership, verdict.stale_accepted, verdict.disagreements


@pytest.mark.timeout(60)
@pytest.mark.parametrize("procs", [1, 2], ids=["one-process", "two-nodes"])
async def test_racing_workers_never_share_a_lease_and_stale_writes_are_refused(
    race_url: str, procs: int
) -> None:
    phase = phase_for(race_url, procs=procs)
    tallies = await run_phase(phase)
    verdict = await check(phase, tallies)
    counts = totals(tallies)

    assert [error for tally in tallies for error in tally.errors] == []
    assert verdict.problems == []
    assert findings(verdict) == (0, 0, 0)
    # The race took place: leases were refused and changed hands, holders walked away or
    # went on as zombies, and every write made knowing it was stale was refused (how many
    # zombies a newer claim fenced in time depends on the machine's load).
    assert counts["lease_held"] > 0
    assert counts["claims"] > 2 * len(phase.tasks)
    assert counts["zombies"] + counts["walked_away"] > 0
    assert counts["stale_refused"] == counts["stale_attempts"]
    assert verdict.rows_checked >= counts["checkpoints"] + 2 * counts["effects"] > 0


async def test_the_checker_finds_a_double_grant_a_stale_row_and_a_lost_write(
    tmp_path: Path,
) -> None:
    """What a broken store would leave behind, planted in a clean run, is found."""
    db = tmp_path / "effects.db"
    phase = phase_for(f"sqlite:///{db}", workers=4, seconds=1.5)
    tallies = await run_phase(phase)
    assert findings(await check(phase, tallies)) == (0, 0, 0)
    grants = sorted(
        (g for t in tallies for g in t.grants), key=lambda g: (g["task"], g["generation"])
    )

    # A grant inside another worker's lease (as if the store had granted it early).
    before, after = next(
        (a, b)
        for a, b in itertools.pairwise(grants)
        if a["task"] == b["task"] and a["worker"] != b["worker"]
    )
    saved = after["acquired_us"]
    after["acquired_us"] = before["acquired_us"]
    assert (await check(phase, tallies)).double_ownership == 1
    after["acquired_us"] = saved

    # A write the workers saw accepted is not in the store.
    writes = tallies[0].writes
    lost = next(i for i, w in enumerate(writes) if w[0] == "checkpoint")
    dropped = writes.pop(lost)
    assert (await check(phase, tallies)).disagreements == 1
    writes.insert(lost, dropped)

    # The store holds a checkpoint by a superseded generation, stamped after the takeover.
    with closing(sqlite3.connect(db)) as connection, connection:
        connection.execute(
            "INSERT INTO checkpoints (task, seq, stage, attempt_id, generation, outputs,"
            " created_at) SELECT task, MAX(seq) + 1, 'S', ?, ?, '{}', ? FROM checkpoints"
            " WHERE task = ?",
            (before["attempt"], before["generation"], wall_us(), before["task"]),
        )
    verdict = await check(phase, tallies)
    assert verdict.stale_accepted == 1
    assert verdict.disagreements == 1  # one checkpoint more than the workers saw accepted
