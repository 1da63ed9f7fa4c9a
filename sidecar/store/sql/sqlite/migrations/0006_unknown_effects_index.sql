-- 0006: effects_by_state_time (state, created_at) gives way to an index of only the
-- effects that wait for a human (state 'unknown'), by task.  Every effect passed through
-- the old index twice (recorded pending, then its outcome), which cost each commit of
-- an effect two more pages written to the WAL; SQLite used it only to find unknown
-- effects (the gauge, the "waiting" tasks, prune's count), which the new one serves, and
-- lists effects across tasks by state with a scan either way.
DROP INDEX effects_by_state_time;
CREATE INDEX effects_unknown ON effects (task) WHERE state = 'unknown';
