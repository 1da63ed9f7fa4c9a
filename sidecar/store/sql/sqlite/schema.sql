-- The SQLite store's schema, as it stands after every migration.
-- Fresh databases are created from this file; existing ones are upgraded by the numbered
-- files in migrations/.  tests/integration/store/test_sqlite_migrations.py proves both
-- paths end in the same schema.  Times are INTEGER microseconds since the Unix epoch (UTC).

CREATE TABLE tasks (
    task            TEXT PRIMARY KEY,
    generation      INTEGER NOT NULL CHECK (generation >= 0),
    checkpoint_seq  INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    -- marked done (claims refused until reopened) and the last reopening (0005)
    done_at         INTEGER,
    done_by         TEXT,
    done_note       TEXT,
    reopened_at     INTEGER,
    reopened_by     TEXT,
    reopened_note   TEXT
) STRICT;
CREATE INDEX tasks_by_created ON tasks (created_at);
CREATE INDEX tasks_by_updated ON tasks (updated_at);

CREATE TABLE attempts (
    attempt_id  TEXT PRIMARY KEY,
    task        TEXT NOT NULL REFERENCES tasks (task),
    generation  INTEGER NOT NULL,
    worker      TEXT NOT NULL,
    claimed_at  INTEGER NOT NULL,
    ended_at    INTEGER,
    end_reason  TEXT CHECK (end_reason IN ('released', 'superseded', 'expired')),
    lease_until INTEGER,  -- once ended: the last moment its lease let it act (0002)
    -- how its agent ended, as its worker reported it on release (0004)
    exit_code   INTEGER CHECK (exit_code BETWEEN 0 AND 255),
    exit_signal TEXT,
    exit_error  TEXT,   -- the command could not be started (e.g. "command not found")
    lease_lost  INTEGER NOT NULL DEFAULT 0 CHECK (lease_lost IN (0, 1)),
    UNIQUE (task, generation)
) STRICT;

-- One row per task: the lease of its current generation (released or not).
CREATE TABLE leases (
    task         TEXT PRIMARY KEY REFERENCES tasks (task),
    attempt_id   TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation   INTEGER NOT NULL,
    worker       TEXT NOT NULL,
    acquired_at  INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    ttl_s        REAL NOT NULL,     -- default extension of a heartbeat
    released_at  INTEGER
) STRICT;

CREATE TABLE checkpoints (
    task        TEXT NOT NULL REFERENCES tasks (task),
    seq         INTEGER NOT NULL,
    stage       TEXT NOT NULL,
    attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation  INTEGER NOT NULL,
    outputs     TEXT NOT NULL,  -- JSON object
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (task, seq)
) STRICT;

CREATE TABLE effects (
    task               TEXT NOT NULL REFERENCES tasks (task),
    key                TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('pending', 'completed', 'failed', 'unknown')),
    kind               TEXT NOT NULL,
    rule               TEXT NOT NULL,
    origin_attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id),
    attempt_id         TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation         INTEGER NOT NULL,
    fingerprint        TEXT NOT NULL,
    idempotency_key    TEXT,
    request            TEXT NOT NULL,  -- JSON summary; secrets are redacted before it gets here
    response_status    INTEGER,
    response_headers   TEXT,           -- JSON list of [name, value] pairs
    response_body      BLOB,
    detail             TEXT,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    PRIMARY KEY (task, key)
) STRICT;

CREATE INDEX effects_by_task_time ON effects (task, created_at, key);
-- The effects that wait for a human (0006): only these, so that an effect's commits
-- do not write this index's pages too.
CREATE INDEX effects_unknown ON effects (task) WHERE state = 'unknown';

CREATE TABLE effect_events (
    id          INTEGER PRIMARY KEY,
    task        TEXT NOT NULL,
    key         TEXT NOT NULL,
    event       TEXT NOT NULL,
    attempt_id  TEXT NOT NULL,
    generation  INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    detail      TEXT,
    FOREIGN KEY (task, key) REFERENCES effects (task, key)
) STRICT;

CREATE INDEX effect_events_by_task ON effect_events (task, id);
CREATE INDEX effect_events_by_key ON effect_events (task, key, id);

-- Writes refused for a stale generation: evidence that fencing is active.
CREATE TABLE fence_refusals (
    id                  INTEGER PRIMARY KEY,
    task                TEXT NOT NULL,
    operation           TEXT NOT NULL,
    attempt_id          TEXT NOT NULL,
    generation          INTEGER NOT NULL,
    current_generation  INTEGER NOT NULL,
    at                  INTEGER NOT NULL,
    reason              TEXT NOT NULL
) STRICT;

CREATE INDEX fence_refusals_by_task ON fence_refusals (task, id);

-- Scratch row for the "is the store writable" probe (insert + delete in one transaction).
CREATE TABLE write_probe (
    id  INTEGER PRIMARY KEY,
    at  INTEGER NOT NULL
) STRICT;
