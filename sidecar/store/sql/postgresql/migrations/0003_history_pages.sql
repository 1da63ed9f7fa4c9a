-- 0003: the list routes read a page at a time: a task's effects in the order they were
-- first recorded with the audit trail of just those effects, tasks newest first, and
-- effects across tasks by state (what waits for a human) newest first.
CREATE INDEX effects_by_task_time ON effects (task, created_at, key COLLATE "C");
CREATE INDEX effect_events_by_key ON effect_events (task, key, id);
CREATE INDEX effects_by_state_time ON effects (state, created_at);
CREATE INDEX tasks_by_created ON tasks (created_at);
