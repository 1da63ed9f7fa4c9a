-- 0003: the history routes read a task's effects a page at a time, in the order they
-- were first recorded, and the audit trail of just those effects.
CREATE INDEX effects_by_task_time ON effects (task, created_at, key);
CREATE INDEX effect_events_by_key ON effect_events (task, key, id);
