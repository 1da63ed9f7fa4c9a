-- 0005: a task can be marked done (claims are refused until it is reopened) and its
-- history pruned once it ended: who marked it done or reopened it, when and why, and an
-- index to find tasks not updated since a cutoff.
ALTER TABLE tasks ADD COLUMN done_at BIGINT;
ALTER TABLE tasks ADD COLUMN done_by TEXT;
ALTER TABLE tasks ADD COLUMN done_note TEXT;
ALTER TABLE tasks ADD COLUMN reopened_at BIGINT;
ALTER TABLE tasks ADD COLUMN reopened_by TEXT;
ALTER TABLE tasks ADD COLUMN reopened_note TEXT;
CREATE INDEX tasks_by_updated ON tasks (updated_at);
