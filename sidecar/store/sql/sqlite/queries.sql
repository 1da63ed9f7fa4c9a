-- Named statements of the SQLite store.  A block starts at "-- name: NAME" and runs to
-- the next one.  Lists are passed as one JSON array parameter (json_each), so a
-- statement's text is the same whatever the batch size and stays in the statement cache.

-- name: load_tasks
SELECT t.task, t.generation, t.checkpoint_seq, t.created_at, t.updated_at,
       l.attempt_id, l.generation, l.worker, l.acquired_at, l.expires_at, l.ttl_s, l.released_at,
       t.done_at, t.done_by, t.done_note, t.reopened_at, t.reopened_by, t.reopened_note
FROM tasks AS t
LEFT JOIN leases AS l ON l.task = t.task
WHERE t.task IN (SELECT value FROM json_each(?));

-- name: load_last_checkpoints
SELECT c.task, c.seq, c.stage, c.attempt_id, c.generation, c.outputs, c.created_at
FROM tasks AS t
JOIN checkpoints AS c ON c.task = t.task AND c.seq = t.checkpoint_seq
WHERE t.task IN (SELECT value FROM json_each(?));

-- name: load_effects
SELECT e.task, e.key, e.state, e.kind, e.rule, e.origin_attempt_id, e.attempt_id,
       e.generation, e.fingerprint, e.idempotency_key, e.request, e.response_status,
       e.response_headers, e.response_body, e.detail, e.created_at, e.updated_at
FROM json_each(?) AS wanted
JOIN effects AS e
  ON e.task = json_extract(wanted.value, '$[0]') AND e.key = json_extract(wanted.value, '$[1]');

-- name: upsert_task
INSERT INTO tasks (task, generation, checkpoint_seq, created_at, updated_at, done_at, done_by,
                   done_note, reopened_at, reopened_by, reopened_note)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task) DO UPDATE SET
    generation = excluded.generation,
    checkpoint_seq = excluded.checkpoint_seq,
    updated_at = excluded.updated_at,
    done_at = excluded.done_at,
    done_by = excluded.done_by,
    done_note = excluded.done_note,
    reopened_at = excluded.reopened_at,
    reopened_by = excluded.reopened_by,
    reopened_note = excluded.reopened_note;

-- name: upsert_lease
INSERT INTO leases (task, attempt_id, generation, worker, acquired_at, expires_at, ttl_s,
                    released_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task) DO UPDATE SET
    attempt_id = excluded.attempt_id,
    generation = excluded.generation,
    worker = excluded.worker,
    acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at,
    ttl_s = excluded.ttl_s,
    released_at = excluded.released_at;

-- name: insert_attempt
INSERT INTO attempts (attempt_id, task, generation, worker, claimed_at)
VALUES (?, ?, ?, ?, ?);

-- name: end_attempt
UPDATE attempts SET ended_at = ?, end_reason = ?, lease_until = ?
WHERE attempt_id = ? AND ended_at IS NULL;

-- name: note_attempt_exit
UPDATE attempts SET exit_code = ?, exit_signal = ?, exit_error = ?, lease_lost = ?
WHERE attempt_id = ? AND task = ? AND generation = ?
  AND exit_code IS NULL AND exit_signal IS NULL AND lease_lost = 0;

-- name: insert_checkpoint
INSERT INTO checkpoints (task, seq, stage, attempt_id, generation, outputs, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: upsert_effect
INSERT INTO effects (task, key, state, kind, rule, origin_attempt_id, attempt_id, generation,
                     fingerprint, idempotency_key, request, response_status, response_headers,
                     response_body, detail, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (task, key) DO UPDATE SET
    state = excluded.state,
    attempt_id = excluded.attempt_id,
    generation = excluded.generation,
    response_status = excluded.response_status,
    response_headers = excluded.response_headers,
    response_body = excluded.response_body,
    detail = excluded.detail,
    updated_at = excluded.updated_at;

-- name: insert_event
INSERT INTO effect_events (task, key, event, attempt_id, generation, at, detail)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: insert_refusal
INSERT INTO fence_refusals (task, operation, attempt_id, generation, current_generation, at,
                            reason)
VALUES (?, ?, ?, ?, ?, ?, ?);

-- name: probe_insert
INSERT INTO write_probe (at) VALUES (?);

-- name: probe_delete
DELETE FROM write_probe;

-- name: all_tasks
SELECT t.task, t.generation, t.checkpoint_seq, t.created_at, t.updated_at,
       l.attempt_id, l.generation, l.worker, l.acquired_at, l.expires_at, l.ttl_s, l.released_at,
       t.done_at, t.done_by, t.done_note, t.reopened_at, t.reopened_by, t.reopened_note
FROM tasks AS t
LEFT JOIN leases AS l ON l.task = t.task
ORDER BY t.task;

-- name: all_last_checkpoints
SELECT c.task, c.seq, c.stage, c.attempt_id, c.generation, c.outputs, c.created_at
FROM tasks AS t
JOIN checkpoints AS c ON c.task = t.task AND c.seq = t.checkpoint_seq;

-- name: all_effect_counts
SELECT task, state, count(*) FROM effects GROUP BY task, state;

-- name: task_effect_counts
SELECT task, state, count(*) FROM effects WHERE task = ? GROUP BY task, state;

-- name: task_attempts
SELECT attempt_id, task, generation, worker, claimed_at, ended_at, end_reason, lease_until,
       exit_code, exit_signal, exit_error, lease_lost
FROM attempts WHERE task = ? ORDER BY generation;

-- name: attempt
SELECT attempt_id, task, generation, worker, claimed_at, ended_at, end_reason, lease_until,
       exit_code, exit_signal, exit_error, lease_lost
FROM attempts WHERE attempt_id = ?;

-- name: task_checkpoints
SELECT task, seq, stage, attempt_id, generation, outputs, created_at
FROM checkpoints WHERE task = ? ORDER BY seq;

-- name: task_effects
SELECT task, key, state, kind, rule, origin_attempt_id, attempt_id, generation, fingerprint,
       idempotency_key, request, response_status, response_headers, response_body, detail,
       created_at, updated_at
FROM effects WHERE task = ? ORDER BY created_at, key;

-- name: task_effect_events
SELECT task, key, event, attempt_id, generation, at, detail
FROM effect_events WHERE task = ? ORDER BY id;

-- name: task_effects_page
-- A page of task_effects: those after (created_at, key), at most LIMIT of them.
SELECT task, key, state, kind, rule, origin_attempt_id, attempt_id, generation, fingerprint,
       idempotency_key, request, response_status, response_headers, response_body, detail,
       created_at, updated_at
FROM effects
WHERE task = ? AND (created_at > ? OR (created_at = ? AND key > ?))
ORDER BY created_at, key LIMIT ?;

-- name: task_checkpoints_page
SELECT task, seq, stage, attempt_id, generation, outputs, created_at
FROM checkpoints WHERE task = ? AND seq > ? ORDER BY seq LIMIT ?;

-- name: effect_events_of
-- The audit trail of the given (task, key) pairs, oldest first.
SELECT ev.task, ev.key, ev.event, ev.attempt_id, ev.generation, ev.at, ev.detail
FROM json_each(?) AS wanted
JOIN effect_events AS ev
  ON ev.task = json_extract(wanted.value, '$[0]') AND ev.key = json_extract(wanted.value, '$[1]')
ORDER BY ev.id;

-- name: gauges
SELECT (SELECT count(*) FROM effects WHERE state = 'unknown'),
       (SELECT count(*) FROM leases WHERE released_at IS NULL AND expires_at > ?);

-- name: tasks_page
-- Tasks newest first, after the cursor (created_at, task), filtered by the worker of
-- their lease and by state: leased (a live lease at now), free (none, and not done),
-- waiting (an effect waits for a human), done (marked done).  Parameters: after_at,
-- after_at, after_task, worker, worker, state, now, now, limit.
SELECT t.task, t.generation, t.checkpoint_seq, t.created_at, t.updated_at,
       l.attempt_id, l.generation, l.worker, l.acquired_at, l.expires_at, l.ttl_s, l.released_at,
       t.done_at, t.done_by, t.done_note, t.reopened_at, t.reopened_by, t.reopened_note
FROM tasks AS t
LEFT JOIN leases AS l ON l.task = t.task
WHERE (t.created_at < ? OR (t.created_at = ? AND t.task < ?))
  AND (? IS NULL OR l.worker = ?)
  AND CASE ?
        WHEN 'leased' THEN l.released_at IS NULL AND l.expires_at > ?
        WHEN 'free' THEN t.done_at IS NULL AND (l.task IS NULL OR l.released_at IS NOT NULL
                                              OR l.expires_at <= ?)
        WHEN 'done' THEN t.done_at IS NOT NULL
        WHEN 'waiting' THEN EXISTS (
          SELECT 1 FROM effects AS e WHERE e.task = t.task AND e.state = 'unknown')
        ELSE 1 END
ORDER BY t.created_at DESC, t.task DESC
LIMIT ?;

-- name: effect_counts_of
SELECT task, state, count(*) FROM effects
WHERE task IN (SELECT value FROM json_each(?))
GROUP BY task, state;

-- name: effects_across
-- Effects of every task newest first, after the cursor (created_at, task, key), filtered
-- by state, task and rule.  Parameters: after_at, after_at, after_task, after_task,
-- after_key, state, state, task, task, rule, rule, limit.
SELECT task, key, state, kind, rule, origin_attempt_id, attempt_id, generation, fingerprint,
       idempotency_key, request, response_status, response_headers, response_body, detail,
       created_at, updated_at
FROM effects
WHERE (created_at < ?
       OR (created_at = ? AND (task < ?
                                  OR (task = ? AND key < ?))))
  AND (? IS NULL OR state = ?)
  AND (? IS NULL OR task = ?)
  AND (? IS NULL OR rule = ?)
ORDER BY created_at DESC, task DESC, key DESC
LIMIT ?;

-- name: task_refusals
SELECT task, operation, attempt_id, generation, current_generation, at, reason
FROM fence_refusals WHERE task = ? ORDER BY id;

-- name: load_task_rows
-- What prune reads of each task: its rows per table, and its effects unknown and pending.
SELECT wanted.value,
       (SELECT count(*) FROM effect_events WHERE task = wanted.value),
       (SELECT count(*) FROM effects WHERE task = wanted.value),
       (SELECT count(*) FROM checkpoints WHERE task = wanted.value),
       (SELECT count(*) FROM fence_refusals WHERE task = wanted.value),
       (SELECT count(*) FROM attempts WHERE task = wanted.value),
       (SELECT count(*) FROM effects WHERE task = wanted.value AND state = 'unknown'),
       (SELECT count(*) FROM effects WHERE task = wanted.value AND state = 'pending')
FROM json_each(?) AS wanted;

-- name: stale_tasks
-- Tasks last updated before a cutoff, by name after a cursor: prune's candidates.
SELECT task FROM tasks
WHERE updated_at < ? AND task > ?
ORDER BY task LIMIT ?;

-- name: delete_task_effect_events
DELETE FROM effect_events WHERE task = ?;

-- name: delete_task_effects
DELETE FROM effects WHERE task = ?;

-- name: delete_task_checkpoints
DELETE FROM checkpoints WHERE task = ?;

-- name: delete_task_fence_refusals
DELETE FROM fence_refusals WHERE task = ?;

-- name: delete_task_leases
DELETE FROM leases WHERE task = ?;

-- name: delete_task_attempts
DELETE FROM attempts WHERE task = ?;

-- name: delete_task_tasks
DELETE FROM tasks WHERE task = ?;

-- name: events_since
-- `sidecar review`: audit lines of the given kinds (one JSON array) at or after a time,
-- a page at a time in id order.  Parameters: after_id, since, kinds, limit.
SELECT ev.id, ev.task, ev.key, ev.event, ev.attempt_id, ev.generation, ev.at, ev.detail
FROM effect_events AS ev
WHERE ev.id > ? AND ev.at >= ? AND ev.event IN (SELECT value FROM json_each(?))
ORDER BY ev.id LIMIT ?;

-- name: refusals_since
-- `sidecar review`: fence refusals at or after a time, a page at a time in id order.
SELECT id, task, operation, attempt_id, generation, current_generation, at, reason
FROM fence_refusals
WHERE id > ? AND at >= ?
ORDER BY id LIMIT ?;

-- name: stages_since
-- `sidecar review`: checkpoints of attempts claimed at or after a time, with their
-- attempt's claim and end and the task's lease ttl, in (task, seq) order after a cursor.
-- Parameters: since, after_task, after_task, after_seq, limit.
SELECT c.task, c.seq, c.stage, c.attempt_id, c.created_at, a.claimed_at, a.end_reason,
       a.lease_until, l.ttl_s
FROM checkpoints AS c
JOIN attempts AS a ON a.attempt_id = c.attempt_id
LEFT JOIN leases AS l ON l.task = c.task
WHERE a.claimed_at >= ? AND (c.task > ? OR (c.task = ? AND c.seq > ?))
ORDER BY c.task, c.seq LIMIT ?;
