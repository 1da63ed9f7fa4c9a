-- 0001: the first schema: tasks, attempts, leases, checkpoints, effects and their audit trail.
-- Same tables, columns and versions as the SQLite store; times are integer microseconds
-- since the epoch and JSON is text, so both stores share one row mapping (rows.py).
CREATE TABLE tasks (
    task            TEXT PRIMARY KEY,
    generation      BIGINT NOT NULL CHECK (generation >= 0),
    checkpoint_seq  BIGINT NOT NULL DEFAULT 0,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);

CREATE TABLE attempts (
    attempt_id  TEXT PRIMARY KEY,
    task        TEXT NOT NULL REFERENCES tasks (task),
    generation  BIGINT NOT NULL,
    worker      TEXT NOT NULL,
    claimed_at  BIGINT NOT NULL,
    ended_at    BIGINT,
    end_reason  TEXT CHECK (end_reason IN ('released', 'superseded', 'expired')),
    UNIQUE (task, generation)
);

-- One row per task: the lease of its current generation (released or not).
CREATE TABLE leases (
    task         TEXT PRIMARY KEY REFERENCES tasks (task),
    attempt_id   TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation   BIGINT NOT NULL,
    worker       TEXT NOT NULL,
    acquired_at  BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    ttl_s        DOUBLE PRECISION NOT NULL,  -- default extension of a heartbeat
    released_at  BIGINT
);

CREATE TABLE checkpoints (
    task        TEXT NOT NULL REFERENCES tasks (task),
    seq         BIGINT NOT NULL,
    stage       TEXT NOT NULL,
    attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation  BIGINT NOT NULL,
    outputs     TEXT NOT NULL,  -- JSON object
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (task, seq)
);

CREATE TABLE effects (
    task               TEXT NOT NULL REFERENCES tasks (task),
    key                TEXT NOT NULL,
    state              TEXT NOT NULL CHECK (state IN ('pending', 'completed', 'failed', 'unknown')),
    kind               TEXT NOT NULL,
    rule               TEXT NOT NULL,
    origin_attempt_id  TEXT NOT NULL REFERENCES attempts (attempt_id),
    attempt_id         TEXT NOT NULL REFERENCES attempts (attempt_id),
    generation         BIGINT NOT NULL,
    fingerprint        TEXT NOT NULL,
    idempotency_key    TEXT,
    request            TEXT NOT NULL,  -- JSON summary; secrets are redacted before it gets here
    response_status    INTEGER,
    response_headers   TEXT,           -- JSON list of [name, value] pairs
    response_body      BYTEA,
    detail             TEXT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (task, key)
);

CREATE TABLE effect_events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task        TEXT NOT NULL,
    key         TEXT NOT NULL,
    event       TEXT NOT NULL,
    attempt_id  TEXT NOT NULL,
    generation  BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    detail      TEXT,
    FOREIGN KEY (task, key) REFERENCES effects (task, key)
);

CREATE INDEX effect_events_by_task ON effect_events (task, id);

-- Writes refused for a stale generation: evidence that fencing is active.
CREATE TABLE fence_refusals (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task                TEXT NOT NULL,
    operation           TEXT NOT NULL,
    attempt_id          TEXT NOT NULL,
    generation          BIGINT NOT NULL,
    current_generation  BIGINT NOT NULL,
    at                  BIGINT NOT NULL,
    reason              TEXT NOT NULL
);

CREATE INDEX fence_refusals_by_task ON fence_refusals (task, id);

-- Scratch row for the "is the store writable" probe (insert + delete in one transaction).
CREATE TABLE write_probe (
    id  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at  BIGINT NOT NULL
);
